// The training log that plot reads (svg_write_loss_curve: the CSV, then the
// charts). A picture written must hold finite numbers inside it: every
// number in an attribute (coordinates, sizes, points) finite and within
// +-1e5 of the origin.
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *csv = fuzz_file(0, data, size, ".csv"), *svg = fuzz_file(1, NULL, 0, ".svg");
    if (svg_write_loss_curve(svg, csv, "fuzz") == 0) {
        FILE *f = fopen(svg, "rb");
        fuzz_require(f != NULL, "no picture");
        char *text = NULL;
        size_t capacity = 0;
        ssize_t n;
        while ((n = getline(&text, &capacity, f)) > 0)
            for (const char *p = text; (p = strstr(p, "=\"")) != NULL; ) {
                p += 2;
                while (*p && *p != '"') {
                    char *end;
                    double v = strtod(p, &end);
                    if (end == p)
                        break;
                    fuzz_require(isfinite(v) && fabs(v) <= 1e5, "a number outside the picture");
                    p = end;
                    while (*p == ',' || *p == ' ')
                        p++;
                }
            }
        free(text);
        fclose(f);
    }
    return 0;
}
