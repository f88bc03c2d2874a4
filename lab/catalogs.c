// lab/catalogs.c: real sentence pairs from the machine's own message catalogs
//
// Every Debian or Ubuntu machine carries human translations of English sentences: the gettext
// message catalogs of its programs, /usr/share/locale/LANG/LC_MESSAGES/*.mo. `./transformer
// catalogs` reads them (GNU's .mo format, read here from its definition: no libintl), keeps the
// messages that are plain sentences, and writes them as source<TAB>target lines in train.tsv,
// dev.tsv and test.tsv, the data `make translate` trains on. Nothing is downloaded.
//
// A .mo file (GNU gettext manual, "The Format of GNU MO Files"), all numbers 32-bit words in the
// byte order of its writer, told by the magic number:
//
//   offset  0   magic 0x950412de (read as 0xde120495: the other byte order)
//           4   file format revision: major (top 16 bits) 0 or 1
//           8   N, the number of strings
//          12   O, offset of the table of original strings: N (length, offset) pairs
//          16   T, offset of the table of translations: N (length, offset) pairs
//          20   hash table size and offset (not read here; a lookup needs them, a reader of all
//               messages does not)
//
// Each string is `length` bytes at `offset`, followed by a zero byte that the length does not
// count. An original "CONTEXT\x04MESSAGE" has a context (msgctxt); "SINGULAR\0PLURAL" is a plural
// entry, whose translation holds each plural form, separated by zero bytes. The entry with the
// empty original is the catalog's header (its Language:, its Plural-Forms:), not a message.
//
// The checks before any message is taken (a damaged catalog is skipped whole, with one line, and
// counted): at least the 28 bytes of the header; the magic number; the revision; both tables
// inside the file, after the header and apart from each other; each string inside the file, after
// the header, ending with its zero byte; lengths and offsets added in 64 bits, so that a length
// that would overflow 32 is a string past the end, never a wrap-around.

#include <dirent.h>

// The reasons a message is not kept, in the order they are tried: a message is counted under the
// first that drops it.
enum {
    CATALOG_DROP_PLURAL_OR_CONTEXT,   // a plural entry, or a context with no message after it
    CATALOG_DROP_NOT_UTF8,            // a side that is not UTF-8 text
    CATALOG_DROP_LINES,               // a line break in either side, other than at its end
    CATALOG_DROP_FORMAT,              // printf's %, {0} or {name}, $VAR or ${VAR}
    CATALOG_DROP_MARKUP,              // <tag>, &entity;, a backslash, a control character (a tab)
    CATALOG_DROP_ACCELERATOR,         // _File (GTK), &File (Qt, KDE)
    CATALOG_DROP_WORDS,               // English outside min..max words, or a translation of none
                                      // or of more than twice max
    CATALOG_DROP_SAME,                // the translation is the English sentence itself
    CATALOG_DROP_DUPLICATE,           // the English sentence again (one translation kept)
    NUM_CATALOG_DROPS
};

static const char *const catalog_drop_names[NUM_CATALOG_DROPS] = {
    "plural or context only",
    "not UTF-8",
    "more than one line",
    "format directives",
    "markup or escapes",
    "accelerators",
    "word count",
    "source = target",
    "source seen before",
};

// The size of a .mo file's header, the smallest a catalog can be.
#define MO_HEADER_BYTES 28
#define MO_MAGIC 0x950412deu
// Larger files are refused (the largest catalog on a Debian machine is a few MB).
#define MO_MAX_BYTES (256u << 20)

// One pair kept so far: the English sentence and its translation, each with its white space
// made single spaces, and the catalog it came from (an index into CatalogReader.names).
typedef struct {
    char *source;
    char *target;
    int catalog;
} CatalogPair;

// What reading catalogs collects: the pairs, the catalogs' names (a domain once, however many
// files carry it), and the counts the summary prints.
typedef struct {
    int min_words;                  // the English side's fewest and most words
    int max_words;
    CatalogPair *pairs;
    int count;
    int capacity;
    char **names;                   // catalog domains, "git" for .../git.mo
    int *kept_by_name;              // pairs kept from each, after the duplicates are dropped
    int num_names;
    int catalogs_read;              // files read whole
    int catalogs_damaged;           // files skipped with a line saying why
    long long messages;             // entries of the files read, their headers not counted
    long long dropped[NUM_CATALOG_DROPS];
} CatalogReader;

static void catalog_reader_init(CatalogReader *reader, int min_words, int max_words) {
    memset(reader, 0, sizeof *reader);
    reader->min_words = min_words;
    reader->max_words = max_words;
}

static void catalog_reader_free(CatalogReader *reader) {
    for (int i = 0; i < reader->count; i++) {
        free(reader->pairs[i].source);
        free(reader->pairs[i].target);
    }
    for (int i = 0; i < reader->num_names; i++) free(reader->names[i]);
    free(reader->pairs);
    free(reader->names);
    free(reader->kept_by_name);
    memset(reader, 0, sizeof *reader);
}

// The index of a catalog's name, added if new.
static int catalog_name_index(CatalogReader *reader, const char *name) {
    for (int i = 0; i < reader->num_names; i++)
        if (strcmp(reader->names[i], name) == 0)
            return i;
    int n = reader->num_names;
    reader->names = checked_realloc(reader->names, (size_t)n + 1, sizeof(char *), "catalog names");
    reader->kept_by_name = checked_realloc(reader->kept_by_name, (size_t)n + 1, sizeof(int),
                                           "catalog names");
    reader->names[n] = checked_calloc(strlen(name) + 1, 1, "catalog name");
    memcpy(reader->names[n], name, strlen(name));
    reader->kept_by_name[n] = 0;
    reader->num_names = n + 1;
    return n;
}

// ---- the .mo format -----------------------------------------------------------------------------

// The 32-bit word at p in the catalog's byte order.
static uint32_t mo_word(const unsigned char *p, int big_endian) {
    if (big_endian)
        return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | (uint32_t)p[0];
}

// A checked catalog: its byte order, its number of strings and where its two tables are.
typedef struct {
    int big_endian;
    uint32_t num_strings;
    uint32_t originals;             // offset of the originals' table
    uint32_t translations;          // offset of the translations' table
} MoTables;

// NULL when the string of table entry i (at table_offset) lies in the file as the format says,
// else what is wrong with it. which: "original" or "translation", for the message.
static const char *mo_string_check(const unsigned char *data, size_t size, const MoTables *tables,
                                   uint32_t table_offset, uint32_t i, const char *which) {
    const unsigned char *entry = data + table_offset + 8 * (size_t)i;
    uint64_t length = mo_word(entry, tables->big_endian);
    uint64_t offset = mo_word(entry + 4, tables->big_endian);
    if (offset < MO_HEADER_BYTES)
        return errorf("%s %u: offset %llu is inside the %d-byte header", which, i,
                      (unsigned long long)offset, MO_HEADER_BYTES);
    if (offset + length >= size)
        return errorf("%s %u: %llu bytes at offset %llu run past the end of the file (%zu bytes)",
                      which, i, (unsigned long long)length, (unsigned long long)offset, size);
    if (data[offset + length] != 0)
        return errorf("%s %u: no zero byte after its %llu bytes at offset %llu", which, i,
                      (unsigned long long)length, (unsigned long long)offset);
    return NULL;
}

// NULL when data is a .mo catalog whose every string can be read, with its tables in *tables;
// else what is wrong, the first thing found.
static const char *mo_check(const unsigned char *data, size_t size, MoTables *tables) {
    if (size < MO_HEADER_BYTES)
        return errorf("truncated: %zu bytes, a .mo header takes %d", size, MO_HEADER_BYTES);
    memset(tables, 0, sizeof *tables);
    if (mo_word(data, 0) == MO_MAGIC)
        tables->big_endian = 0;
    else if (mo_word(data, 1) == MO_MAGIC)
        tables->big_endian = 1;
    else
        return errorf("magic number 0x%08x; expected 0x950412de (a GNU .mo catalog)",
                      mo_word(data, 0));
    uint32_t revision = mo_word(data + 4, tables->big_endian);
    if (revision >> 16 > 1)
        return errorf("file format revision %u.%u; expected major revision 0 or 1", revision >> 16,
                      revision & 0xffff);
    tables->num_strings = mo_word(data + 8, tables->big_endian);
    tables->originals = mo_word(data + 12, tables->big_endian);
    tables->translations = mo_word(data + 16, tables->big_endian);
    uint64_t table_bytes = 8 * (uint64_t)tables->num_strings;
    const char *names[2] = { "originals", "translations" };
    uint64_t starts[2] = { tables->originals, tables->translations };
    for (int t = 0; t < 2; t++) {
        if (tables->num_strings > 0 && starts[t] < MO_HEADER_BYTES)
            return errorf("the table of %s at offset %llu overlaps the %d-byte header", names[t],
                          (unsigned long long)starts[t], MO_HEADER_BYTES);
        if (starts[t] + table_bytes > size)
            return errorf("the table of %s (%u strings at offset %llu) runs past the end of the "
                          "file (%zu bytes)", names[t], tables->num_strings,
                          (unsigned long long)starts[t], size);
    }
    if (tables->num_strings > 0 && starts[0] < starts[1] + table_bytes &&
        starts[1] < starts[0] + table_bytes)
        return errorf("the tables of originals (offset %u) and translations (offset %u) overlap",
                      tables->originals, tables->translations);
    for (uint32_t i = 0; i < tables->num_strings; i++) {
        const char *error = mo_string_check(data, size, tables, tables->originals, i, "original");
        if (!error)
            error = mo_string_check(data, size, tables, tables->translations, i, "translation");
        if (error)
            return error;
    }
    return NULL;
}

// The string of entry i of the table at table_offset (checked by mo_check) and its length.
static const char *mo_string(const unsigned char *data, const MoTables *tables,
                             uint32_t table_offset, uint32_t i, size_t *length) {
    const unsigned char *entry = data + table_offset + 8 * (size_t)i;
    *length = mo_word(entry, tables->big_endian);
    return (const char *)data + mo_word(entry + 4, tables->big_endian);
}

// ---- the filters --------------------------------------------------------------------------------

static int is_ascii_letter(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_ascii_digit(int c) { return c >= '0' && c <= '9'; }

// A letter for the accelerator rule: an ASCII letter or digit, or the first byte of a UTF-8
// sequence (Ü in "_Über").
static int begins_letter(int c) { return is_ascii_letter(c) || is_ascii_digit(c) || c >= 0xC2; }

// 1 when the text holds a directive that a program fills in: printf's % (any use: %s, %1$s,
// %-10.3f, %%), Python's {0} or {name} and Qt's %1, the shell's $VAR and ${VAR}.
static int has_format_directive(const char *text) {
    for (const unsigned char *s = (const unsigned char *)text; *s; s++) {
        if (*s == '%')
            return 1;
        if (*s == '$' && (s[1] == '{' || s[1] == '_' || is_ascii_letter(s[1])))
            return 1;
        if (*s == '{') {
            const unsigned char *end = s + 1;
            while (*end == '_' || is_ascii_letter(*end) || is_ascii_digit(*end))
                end++;
            if (*end == '}')
                return 1;
        }
    }
    return 0;
}

// 1 when the text holds markup or an escape: a tag (<b>, </b>, <!--, <?xml), an entity (&amp;,
// &#169;), a backslash, or a control character (a tab would break the TSV line).
static int has_markup(const char *text) {
    for (const unsigned char *s = (const unsigned char *)text; *s; s++) {
        if (*s < 0x20 || *s == 0x7F || *s == '\\')
            return 1;
        if (*s == '<' && (is_ascii_letter(s[1]) || s[1] == '/' || s[1] == '!' || s[1] == '?'))
            return 1;
        if (*s == '&') {
            const unsigned char *end = s + 1;
            if (*end == '#')
                end++;
            while (is_ascii_letter(*end) || is_ascii_digit(*end))
                end++;
            if (end > s + 1 && *end == ';')
                return 1;
        }
    }
    return 0;
}

// 1 when the text marks a keyboard accelerator: _ before the letter (GTK's "_Open"), at the start
// of a word (not the _ inside an identifier, max_connections), or & before a letter (Qt's "&Open").
static int has_accelerator(const char *text) {
    for (const unsigned char *s = (const unsigned char *)text; *s; s++) {
        int starts_word = s == (const unsigned char *)text || !begins_letter(s[-1]);
        if (*s == '_' && starts_word && begins_letter(s[1]))
            return 1;
        if (*s == '&' && begins_letter(s[1]))
            return 1;
    }
    return 0;
}

// 1 when the text is UTF-8 (RFC 3629, utf8_sequence_length's rules).
static int is_utf8(const char *text) {
    for (const unsigned char *s = (const unsigned char *)text; *s; ) {
        int n = utf8_sequence_length(s);
        if (n == 0)
            return 0;
        s += n;
    }
    return 1;
}

// The text's words joined by single spaces (a new string) and their number in *words: leading,
// trailing and repeated white space (NOTES §7's set, U+00A0 included) dropped.
static char *words_joined(const char *text, int *words) {
    char *joined = checked_calloc(strlen(text) + 1, 1, "catalog message");
    size_t used = 0;
    size_t n = 0;
    *words = 0;
    for (const char *p = text_next_token(text, &n); p; p = text_next_token(p + n, &n)) {
        if (*words > 0)
            joined[used++] = ' ';
        memcpy(joined + used, p, n);
        used += n;
        ++*words;
    }
    return joined;
}

// A copy of the text without the line breaks that end it.
static char *without_final_line_breaks(const char *text) {
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r'))
        n--;
    char *copy = checked_calloc(n + 1, 1, "catalog message");
    memcpy(copy, text, n);
    return copy;
}

// The filters from "more than one line" on, for two sides that are UTF-8 text without final line
// breaks. Returns the filter that drops them, or -1 with the sides' words joined by single spaces
// (new strings) in *source and *target.
static int catalog_filter_text(const CatalogReader *reader, const char *original,
                               const char *translation, char **source, char **target) {
    if (strpbrk(original, "\n\r") || strpbrk(translation, "\n\r"))
        return CATALOG_DROP_LINES;
    if (has_format_directive(original) || has_format_directive(translation))
        return CATALOG_DROP_FORMAT;
    if (has_markup(original) || has_markup(translation))
        return CATALOG_DROP_MARKUP;
    if (has_accelerator(original) || has_accelerator(translation))
        return CATALOG_DROP_ACCELERATOR;
    int source_words = 0;
    int target_words = 0;
    char *joined_source = words_joined(original, &source_words);
    char *joined_target = words_joined(translation, &target_words);
    int drop = -1;
    if (source_words < reader->min_words || source_words > reader->max_words)
        drop = CATALOG_DROP_WORDS;
    else if (target_words < 1 || target_words > 2 * reader->max_words)
        drop = CATALOG_DROP_WORDS;
    else if (strcmp(joined_source, joined_target) == 0)
        drop = CATALOG_DROP_SAME;
    if (drop >= 0) {
        free(joined_source);
        free(joined_target);
        return drop;
    }
    *source = joined_source;
    *target = joined_target;
    return -1;
}

// One message of a catalog, as the filters see it: the original and the translation, both of
// their full length (a context's \x04 and a plural's zero bytes included). Returns the filter that
// drops it, or -1 with the two sides (new strings) in *source and *target, the context stripped.
static int catalog_filter(const CatalogReader *reader, const char *original, size_t original_length,
                          const char *translation, size_t translation_length, char **source,
                          char **target) {
    *source = NULL;
    *target = NULL;
    const char *context_end = memchr(original, '\x04', original_length);
    if (context_end) {
        original_length -= (size_t)(context_end + 1 - original);
        original = context_end + 1;
    }
    if (original_length == 0)
        return CATALOG_DROP_PLURAL_OR_CONTEXT;
    if (memchr(original, 0, original_length) || memchr(translation, 0, translation_length))
        return CATALOG_DROP_PLURAL_OR_CONTEXT;
    if (!is_utf8(original) || !is_utf8(translation))
        return CATALOG_DROP_NOT_UTF8;
    char *trimmed_original = without_final_line_breaks(original);
    char *trimmed_translation = without_final_line_breaks(translation);
    int drop = catalog_filter_text(reader, trimmed_original, trimmed_translation, source, target);
    free(trimmed_original);
    free(trimmed_translation);
    return drop;
}

// ---- reading catalogs ---------------------------------------------------------------------------

// Reads the catalog in data (size bytes), named name ("git"): its pairs go to the reader, each
// message it drops to the count of its filter. Returns NULL, or what is wrong with the catalog,
// in which case nothing of it was taken.
static const char *catalog_read_bytes(CatalogReader *reader, const unsigned char *data, size_t size,
                                      const char *name) {
    MoTables tables;
    const char *error = mo_check(data, size, &tables);
    if (error)
        return error;
    int catalog = catalog_name_index(reader, name);
    for (uint32_t i = 0; i < tables.num_strings; i++) {
        size_t original_length = 0;
        size_t translation_length = 0;
        const char *original = mo_string(data, &tables, tables.originals, i, &original_length);
        const char *translation = mo_string(data, &tables, tables.translations, i,
                                            &translation_length);
        if (original_length == 0)
            continue;   // the header entry: the catalog's metadata
        reader->messages++;
        char *source = NULL;
        char *target = NULL;
        int drop = catalog_filter(reader, original, original_length, translation,
                                  translation_length, &source, &target);
        if (drop >= 0) {
            reader->dropped[drop]++;
            continue;
        }
        if (reader->count == reader->capacity) {
            reader->capacity = reader->capacity ? 2 * reader->capacity : 1024;
            reader->pairs = checked_realloc(reader->pairs, (size_t)reader->capacity,
                                            sizeof(CatalogPair), "catalog pairs");
        }
        CatalogPair *pair = &reader->pairs[reader->count++];
        pair->source = source;
        pair->target = target;
        pair->catalog = catalog;
    }
    reader->catalogs_read++;
    return NULL;
}

// The catalog's domain from its path: "git" for /usr/share/locale/de/LC_MESSAGES/git.mo.
static void catalog_domain(char *out, size_t size, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 3 && strcmp(base + n - 3, ".mo") == 0)
        n -= 3;
    if (n >= size)
        n = size - 1;
    memcpy(out, base, n);
    out[n] = 0;
}

// Reads one catalog file into the reader. Returns NULL, or a line naming the file and what is
// wrong with it (the file then gave nothing).
static const char *catalog_read_file(CatalogReader *reader, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return errorf("%s: cannot open: %s", path, strerror(errno));
    unsigned char *data = NULL;
    size_t size = 0;
    size_t capacity = 0;
    const char *error = NULL;
    for (;;) {
        if (size == capacity) {
            if (capacity >= MO_MAX_BYTES) {
                error = errorf("%s: larger than %u MB; expected a message catalog", path,
                               MO_MAX_BYTES >> 20);
                break;
            }
            capacity = capacity ? 2 * capacity : 65536;
            data = checked_realloc(data, capacity, 1, "catalog file");
        }
        size_t got = fread(data + size, 1, capacity - size, f);
        size += got;
        if (got == 0)
            break;
    }
    if (!error && ferror(f))
        error = errorf("%s: read error: %s", path, strerror(errno));
    fclose(f);
    if (!error) {
        char name[256];
        catalog_domain(name, sizeof name, path);
        error = catalog_read_bytes(reader, data, size, name);
        if (error)
            error = errorf("%s: %s", path, error);
    }
    free(data);
    return error;
}

// Reads a catalog and says so when it is damaged: one line, and the count of damaged catalogs.
static void catalog_read_or_skip(CatalogReader *reader, const char *path) {
    const char *error = catalog_read_file(reader, path);
    if (!error)
        return;
    fprintf(stderr, "skipped: %s\n", error);
    reader->catalogs_damaged++;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// The entries of a directory, sorted by name (strcmp, so the same order on every machine), "."
// and ".." left out; NULL when it cannot be opened. *count: their number.
static char **sorted_entries(const char *dir, int *count) {
    *count = 0;
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    char **names = NULL;
    int capacity = 0;
    for (struct dirent *entry = readdir(d); entry; entry = readdir(d)) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
            continue;
        if (*count == capacity) {
            capacity = capacity ? 2 * capacity : 64;
            names = checked_realloc(names, (size_t)capacity, sizeof(char *), "directory entries");
        }
        size_t n = strlen(entry->d_name);
        names[*count] = checked_calloc(n + 1, 1, "directory entry");
        memcpy(names[*count], entry->d_name, n);
        ++*count;
    }
    closedir(d);
    if (*count > 1)
        qsort(names, (size_t)*count, sizeof(char *), compare_names);
    return names;
}

static void free_entries(char **names, int count) {
    for (int i = 0; i < count; i++) free(names[i]);
    free(names);
}

static int is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// The deepest folder under a directory given on the command line that is searched.
#define CATALOG_MAX_DEPTH 8

// Reads the catalogs of one language under dir: every LANG/LC_MESSAGES/*.mo at any depth (down to
// CATALOG_MAX_DEPTH folders), in the sorted order of the names.
static void catalog_read_directory(CatalogReader *reader, const char *dir, const char *language,
                                   int depth) {
    int count = 0;
    char **names = sorted_entries(dir, &count);
    if (!names)
        return;
    const char *dir_base = strrchr(dir, '/');
    dir_base = dir_base ? dir_base + 1 : dir;
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash)
        *slash = 0;
    const char *parent_base = slash ? strrchr(parent, '/') : NULL;
    parent_base = parent_base ? parent_base + 1 : (slash ? parent : "");
    int in_language = strcmp(dir_base, "LC_MESSAGES") == 0 && strcmp(parent_base, language) == 0;
    for (int i = 0; i < count; i++) {
        char path[4096];
        int n = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (n < 0 || (size_t)n >= sizeof path)
            continue;
        size_t length = strlen(names[i]);
        int is_catalog = length > 3 && strcmp(names[i] + length - 3, ".mo") == 0;
        if (is_directory(path)) {
            if (depth < CATALOG_MAX_DEPTH)
                catalog_read_directory(reader, path, language, depth + 1);
        } else if (in_language && is_catalog) {
            catalog_read_or_skip(reader, path);
        }
    }
    free_entries(names, count);
}

// Where the catalogs of a Debian or Ubuntu system are (Ubuntu's language packs in the second).
static const char *const system_locale_dirs[] = {
    "/usr/share/locale",
    "/usr/share/locale-langpack",
    "/usr/local/share/locale",
};
#define NUM_SYSTEM_LOCALE_DIRS 3

// ---- writing the pairs --------------------------------------------------------------------------

// 64-bit FNV-1a of a string: the split's hash, written out so that it is the same on every
// machine and in every version of this program.
static uint64_t fnv1a_64(const char *text) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *s = (const unsigned char *)text; *s; s++) {
        h ^= *s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

// The three files the pairs go to, by the hash of the English sentence: 1 in 40 to test, 1 in 40
// to dev, the rest to train. A machine with more catalogs puts a sentence it shares with this
// one in the same file.
enum { CATALOG_TRAIN, CATALOG_DEV, CATALOG_TEST, NUM_CATALOG_SPLITS };
static const char *const catalog_split_names[NUM_CATALOG_SPLITS] = { "train", "dev", "test" };
#define CATALOG_SPLIT_MODULUS 40

static int catalog_split(const char *source) {
    uint64_t bucket = fnv1a_64(source) % CATALOG_SPLIT_MODULUS;
    if (bucket == 0)
        return CATALOG_TEST;
    if (bucket == 1)
        return CATALOG_DEV;
    return CATALOG_TRAIN;
}

// Pairs in the order of their English sentence, then of their translation (bytes, strcmp).
static int compare_catalog_pairs(const void *a, const void *b) {
    const CatalogPair *x = a;
    const CatalogPair *y = b;
    int by_source = strcmp(x->source, y->source);
    if (by_source != 0)
        return by_source;
    int by_target = strcmp(x->target, y->target);
    if (by_target != 0)
        return by_target;
    return x->catalog - y->catalog;
}

// Sorts the pairs and keeps one of each English sentence: the translation first in byte order
// (the rule does not depend on the order in which the catalogs were read, so every machine keeps
// the same one of the same candidates). The others are counted as duplicates and freed.
static void catalog_drop_duplicates(CatalogReader *reader) {
    if (reader->count > 1)
        qsort(reader->pairs, (size_t)reader->count, sizeof(CatalogPair), compare_catalog_pairs);
    int kept = 0;
    for (int i = 0; i < reader->count; i++) {
        CatalogPair *pair = &reader->pairs[i];
        if (kept > 0 && strcmp(reader->pairs[kept - 1].source, pair->source) == 0) {
            free(pair->source);
            free(pair->target);
            reader->dropped[CATALOG_DROP_DUPLICATE]++;
            continue;
        }
        reader->pairs[kept++] = *pair;
    }
    reader->count = kept;
    for (int i = 0; i < reader->num_names; i++) reader->kept_by_name[i] = 0;
    for (int i = 0; i < reader->count; i++) reader->kept_by_name[reader->pairs[i].catalog]++;
}

// Creates dir and the folders above it that are missing (mkdir -p).
static const char *make_directories(const char *dir) {
    char path[4096];
    int n = snprintf(path, sizeof path, "%s", dir);
    if (n <= 0 || (size_t)n >= sizeof path)
        return errorf("--out '%s': too long a path", dir);
    for (char *p = path + 1; ; p++) {
        int at_end = *p == 0;
        if (*p != '/' && !at_end)
            continue;
        *p = 0;
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return errorf("%s: cannot create: %s", path, strerror(errno));
        if (!is_directory(path))
            return errorf("%s: not a directory", path);
        if (at_end)
            break;
        *p = '/';
    }
    return NULL;
}

// Writes the reader's pairs (deduplicated) to dir/train.tsv, dev.tsv and test.tsv, each through a
// .tmp file renamed over it once whole. A file already there is replaced only with force.
// counts: the pairs of each file.
static const char *catalog_write_splits(const CatalogReader *reader, const char *dir, int force,
                                        int counts[NUM_CATALOG_SPLITS]) {
    char paths[NUM_CATALOG_SPLITS][4096];
    char temporary[NUM_CATALOG_SPLITS][4200];
    const char *error = make_directories(dir);
    if (error)
        return error;
    for (int s = 0; s < NUM_CATALOG_SPLITS; s++) {
        int length = snprintf(paths[s], sizeof paths[s], "%s/%s.tsv", dir, catalog_split_names[s]);
        int temporary_length = snprintf(temporary[s], sizeof temporary[s], "%s.tmp", paths[s]);
        if (length >= (int)sizeof paths[s] || temporary_length >= (int)sizeof temporary[s])
            return errorf("%.60s...: the directory's path is too long (at most about %zu bytes)",
                          dir, sizeof paths[s] - 16);
        struct stat st;
        if (stat(paths[s], &st) == 0 && !S_ISREG(st.st_mode))
            return errorf("%s is there and is not a regular file; expected a path for the pairs",
                          paths[s]);
        if (stat(paths[s], &st) == 0 && !force)
            return errorf("%s is already there; --force replaces it", paths[s]);
        counts[s] = 0;
    }
    FILE *files[NUM_CATALOG_SPLITS] = { NULL, NULL, NULL };
    for (int s = 0; s < NUM_CATALOG_SPLITS && !error; s++) {
        files[s] = fopen(temporary[s], "w");
        if (!files[s])
            error = errorf("%s: cannot write: %s", temporary[s], strerror(errno));
    }
    for (int i = 0; i < reader->count && !error; i++) {
        const CatalogPair *pair = &reader->pairs[i];
        int s = catalog_split(pair->source);
        fprintf(files[s], "%s\t%s\n", pair->source, pair->target);
        counts[s]++;
    }
    for (int s = 0; s < NUM_CATALOG_SPLITS; s++) {
        if (!files[s])
            continue;
        int failed = ferror(files[s]);
        if (fclose(files[s]) != 0)
            failed = 1;
        if (failed && !error)
            error = errorf("%s: cannot write: %s", temporary[s], strerror(errno));
    }
    for (int s = 0; s < NUM_CATALOG_SPLITS && !error; s++)
        if (rename(temporary[s], paths[s]) != 0)
            error = errorf("%s: cannot replace: %s", paths[s], strerror(errno));
    if (error)
        for (int s = 0; s < NUM_CATALOG_SPLITS; s++) remove(temporary[s]);
    return error;
}

// ---- the command --------------------------------------------------------------------------------

// The summary's line of the catalogs that gave the most pairs (at most five).
static void print_largest_catalogs(const CatalogReader *reader) {
    int shown[5] = { -1, -1, -1, -1, -1 };
    printf("largest  ");
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < reader->num_names; i++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= shown[j] == i;
            if (taken || reader->kept_by_name[i] == 0)
                continue;
            if (shown[k] < 0 || reader->kept_by_name[i] > reader->kept_by_name[shown[k]])
                shown[k] = i;
        }
        if (shown[k] < 0)
            break;
        printf("%s%s %d", k ? ", " : "", reader->names[shown[k]], reader->kept_by_name[shown[k]]);
    }
    printf(shown[0] < 0 ? "none\n" : "\n");
}

static void print_catalog_drops(const CatalogReader *reader) {
    printf("dropped ");
    for (int d = 0; d < NUM_CATALOG_DROPS; d++)
        printf("%s %s %lld", d ? "," : "", catalog_drop_names[d], reader->dropped[d]);
    printf("\n");
}

static int command_catalogs(int argc, char **argv) {
    const char *usage =
        "usage: ./transformer catalogs [--to LANG] [--out DIR] [--force] [FILE.mo|DIR ...]\n"
        "English->LANG sentence pairs from gettext message catalogs "
        "(GNU .mo files, either byte order,\n"
        "revision 0 or 1), the translations a Debian or Ubuntu machine already carries. "
        "Without FILE or\n"
        "DIR it reads /usr/share/locale, /usr/share/locale-langpack and /usr/local/share/locale; "
        "a DIR\n"
        "is searched for LANG/LC_MESSAGES/*.mo at any depth "
        "(LANG: the folder's name, exactly: de, fr,\n"
        "pt_BR); a FILE is read whatever its language. Writes DIR/train.tsv, dev.tsv and test.tsv\n"
        "(source<TAB>target, sorted), 1 in 40 pairs each to dev and test by a hash of the English\n"
        "sentence (FNV-1a), so the files are the same byte for byte on every run and machine.\n"
        "A message is dropped, and counted under the first of these that applies:\n"
        "  plural or context only  a plural entry (msgid_plural), or a context with no message\n"
        "  not UTF-8               either side\n"
        "  more than one line      a line break in either side, other than at its end\n"
        "  format directives       any %, {0} or {name}, $VAR or ${VAR}, in either side\n"
        "  markup or escapes       <tag>, &entity;, a backslash or a control character (a tab)\n"
        "  accelerators            _ at a word's start before a letter (_Open), & before a letter\n"
        "  word count              English outside --min-words..--max-words words, "
        "or a translation\n"
        "                          of no word or of more than twice --max-words\n"
        "  source = target         the translation is the English itself\n"
        "  source seen before      the same English again: "
        "the translation first in byte order is kept\n"
        "A context (msgctxt) is stripped from the English side; "
        "white space becomes single spaces.\n"
        "A damaged catalog gets a line saying what is wrong, is skipped and counted.";
    const char *language = "de";
    const char *out_dir = "runs/catalogs";
    int force = 0;
    int min_words = 3;
    int max_words = 25;
    int min_pairs = 1;
    Option options[] = {
        TEXT_OPTION("--to", &language,
                    "LANG, the language of the translations (the catalogs' folder name)"),
        TEXT_OPTION("--out", &out_dir, "DIR, where train.tsv, dev.tsv and test.tsv go"),
        FLAG_OPTION("--force", &force,
                    "replace DIR's .tsv files (without it catalogs stops there)"),
        INT_OPTION("--min-words", &min_words, 1, 1000,
                   "the fewest words of an English message kept"),
        INT_OPTION("--max-words", &max_words, 1, 1000, "the most words of an English message kept"),
        INT_OPTION("--min-pairs", &min_pairs, 1, INT_MAX,
                   "stop, writing nothing, when fewer pairs are found (make translate: 2000)"),
    };
    char **paths = checked_calloc((size_t)argc, sizeof(char *), "arguments");
    int num_paths = 0;
    int n = (int)(sizeof options / sizeof *options);
    int status = parse_options("catalogs", usage, options, n, argc, argv, paths, &num_paths);
    if (status) {
        free(paths);
        return status == 2 ? 0 : 1;
    }
    const char *error = NULL;
    if (language[0] == 0 || strchr(language, '/') || strcmp(language, ".") == 0 ||
        strcmp(language, "..") == 0)
        error = errorf("--to '%s' is not a language; expected a folder name such as de or pt_BR",
                       language);
    else if (min_words > max_words)
        error = errorf("--min-words %d is more than --max-words %d", min_words, max_words);
    for (int i = 0; i < num_paths && !error; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0)
            error = errorf("%s: %s; expected a .mo file or a folder", paths[i], strerror(errno));
    }
    if (error) {
        fprintf(stderr, "error: catalogs: %s\n", error);
        free(paths);
        return 1;
    }

    CatalogReader reader;
    catalog_reader_init(&reader, min_words, max_words);
    char looked[1024] = "";
    double start = wall_seconds();
    if (num_paths == 0) {
        for (int i = 0; i < NUM_SYSTEM_LOCALE_DIRS; i++) {
            char dir[4096];
            snprintf(dir, sizeof dir, "%s/%s/LC_MESSAGES", system_locale_dirs[i], language);
            catalog_read_directory(&reader, dir, language, CATALOG_MAX_DEPTH);
            size_t used = strlen(looked);
            snprintf(looked + used, sizeof looked - used, "%s%s/%s/LC_MESSAGES", i ? ", " : "",
                     system_locale_dirs[i], language);
        }
    }
    for (int i = 0; i < num_paths; i++) {
        if (is_directory(paths[i]))
            catalog_read_directory(&reader, paths[i], language, 0);
        else
            catalog_read_or_skip(&reader, paths[i]);
        size_t used = strlen(looked);
        snprintf(looked + used, sizeof looked - used, "%s%s", i ? ", " : "", paths[i]);
    }
    catalog_drop_duplicates(&reader);

    printf("catalogs %d read for %s in %.1f s (%s), %d damaged and skipped\n",
           reader.catalogs_read, language, wall_seconds() - start, looked, reader.catalogs_damaged);
    printf("messages %lld\n", reader.messages);
    print_catalog_drops(&reader);
    print_largest_catalogs(&reader);
    int counts[NUM_CATALOG_SPLITS] = { 0, 0, 0 };
    if (reader.count < min_pairs) {
        error = errorf("found %d English->%s pairs in %d catalogs (%s); expected at least %d",
                       reader.count, language, reader.catalogs_read, looked, min_pairs);
    } else {
        error = catalog_write_splits(&reader, out_dir, force, counts);
    }
    if (error)
        fprintf(stderr, "error: catalogs: %s\n", error);
    else
        printf("kept     %d pairs: %s/train.tsv %d, %s/dev.tsv %d, %s/test.tsv %d\n",
               reader.count, out_dir, counts[CATALOG_TRAIN], out_dir, counts[CATALOG_DEV], out_dir,
               counts[CATALOG_TEST]);
    catalog_reader_free(&reader);
    free(paths);
    return error ? 1 : 0;
}
