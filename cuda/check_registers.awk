# check_registers.awk: make cuda's check that a block of every kernel gets the registers it needs
#
#     awk -f cuda/check_registers.awk KEPT/*.ptx PTXAS.log
#
# ptxas -v says how many registers a thread of each kernel uses ("Used N
# registers"); the PTX (nvcc -keep) says the most threads a block of it may
# have (.maxntid, which __launch_bounds__ sets; without it a launch may ask for
# 1024). A block needs that many warps times a warp's registers, which are
# allocated 256 at a time (compute capabilities 7.0 to 9.0), and gets at most
# 65536: a kernel that needs more compiles, spills nothing, and then fails to
# launch ("too many resources requested for launch"). Each such kernel is
# printed and the exit status is 1; else one line says how many were checked.

function demangled(name,    digits) {   # _Z11adam_kernelPf... -> adam_kernel
    if (match(name, /^_ZL?[0-9]+/)) {
        digits = substr(name, RSTART, RLENGTH)
        sub(/^_ZL?/, "", digits)
        return substr(name, RLENGTH + 1, digits + 0)
    }
    return name
}

FILENAME ~ /\.ptx$/ {
    if (match($0, /\.entry[ \t]+[A-Za-z_0-9$]+/)) {
        entry = substr($0, RSTART, RLENGTH)
        sub(/\.entry[ \t]+/, "", entry)
    } else if (entry != "" && $1 == ".maxntid") {
        line = $0
        gsub(/[.a-z,]/, " ", line)
        split(line, sizes, " ")
        threads[entry] = sizes[1] * (sizes[2] ? sizes[2] : 1) * (sizes[3] ? sizes[3] : 1)
    } else if ($0 ~ /^[ \t]*\{/) {
        entry = ""   # the body: the entry's directives are over
    }
    next
}

/Compiling entry function/ {
    kernel = $0
    sub(/^.*Compiling entry function '/, "", kernel)
    sub(/'.*$/, "", kernel)
    arch = $0
    sub(/^.* for '/, "", arch)
    sub(/'.*$/, "", arch)
}

/Used [0-9]+ registers/ {
    registers = $0
    sub(/^.*Used /, "", registers)
    sub(/ registers.*$/, "", registers)
    block = (kernel in threads) ? threads[kernel] : 1024
    warps = int((block + 31) / 32)
    per_warp = int((registers * 32 + 255) / 256) * 256
    checked++
    if (warps * per_warp > 65536) {
        printf "make cuda: %s (%s) uses %d registers a thread: a block of %d threads (%s) needs %d, more than " \
               "the 65536 a block may have; give it __launch_bounds__ with its largest block, or fewer registers\n", \
               demangled(kernel), arch, registers, block, (kernel in threads) ? "its __launch_bounds__" : \
               "no __launch_bounds__: up to 1024", warps * per_warp
        failed++
    }
}

END {
    if (checked == 0) { print "make cuda: no register counts in the ptxas -v output"; exit 1 }
    if (failed) exit 1
    printf "make cuda: %d kernels, each block within the 65536 registers a block may have (ptxas -v, __launch_bounds__)\n", checked
}
