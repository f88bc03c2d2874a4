// Message catalogs (lab/catalogs.c): the fuzzer's bytes as a .mo file, read
// by catalog_read_bytes and, through a file, by catalog_read_file. A catalog
// that is refused gives nothing; one that is read gives only pairs that
// pass every filter (UTF-8, one line, no control character, no directive,
// the English within the word bounds, not its own translation), and every
// message it holds is either kept or counted under one filter. The pairs
// left after catalog_drop_duplicates are sorted, one per English sentence.
#include "fuzz.h"

// 1 when the kept text is what the filters let through.
static int text_passes_filters(const char *text) {
    if (!is_utf8(text))
        return 0;
    if (has_format_directive(text) || has_markup(text) || has_accelerator(text))
        return 0;
    if (strpbrk(text, "\t\n\r"))
        return 0;
    return text[0] != ' ' && (text[0] == 0 || text[strlen(text) - 1] != ' ');
}

static void check_reader(const CatalogReader *reader, int refused) {
    if (refused) {
        fuzz_require(reader->count == 0 && reader->messages == 0 && reader->catalogs_read == 0,
                     "a refused catalog gave something");
        return;
    }
    long long dropped = 0;
    for (int d = 0; d < NUM_CATALOG_DROPS; d++) dropped += reader->dropped[d];
    fuzz_require(reader->catalogs_read == 1, "a catalog read is not counted");
    fuzz_require(reader->messages == dropped + reader->count,
                 "a message neither kept nor counted as dropped");
    for (int i = 0; i < reader->count; i++) {
        const CatalogPair *pair = &reader->pairs[i];
        int source_words = 0;
        int target_words = 0;
        char *source = words_joined(pair->source, &source_words);
        char *target = words_joined(pair->target, &target_words);
        fuzz_require(strcmp(source, pair->source) == 0 && strcmp(target, pair->target) == 0,
                     "a kept side whose white space is not single spaces");
        fuzz_require(source_words >= reader->min_words && source_words <= reader->max_words &&
                     target_words >= 1 && target_words <= 2 * reader->max_words,
                     "a kept pair outside the word bounds");
        fuzz_require(strcmp(source, target) != 0, "a kept pair whose translation is its source");
        fuzz_require(text_passes_filters(source) && text_passes_filters(target),
                     "a kept pair a filter should drop");
        free(source);
        free(target);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    CatalogReader reader;
    catalog_reader_init(&reader, 3, 25);
    const char *error = catalog_read_bytes(&reader, data, size, "fuzz");
    check_reader(&reader, error != NULL);
    long long count = reader.count;
    catalog_drop_duplicates(&reader);
    for (int i = 1; i < reader.count; i++)
        fuzz_require(strcmp(reader.pairs[i - 1].source, reader.pairs[i].source) < 0,
                     "pairs after dropping duplicates are not sorted and unique");
    fuzz_require(reader.count + reader.dropped[CATALOG_DROP_DUPLICATE] == count,
                 "a duplicate not counted");
    catalog_reader_free(&reader);

    // the same bytes through a file: the same answer
    const char *path = fuzz_file(0, data, size, ".mo");
    catalog_reader_init(&reader, 3, 25);
    const char *file_error = catalog_read_file(&reader, path);
    fuzz_require((file_error == NULL) == (error == NULL) && reader.count == count,
                 "the file reader and the byte reader disagree");
    catalog_reader_free(&reader);
    return 0;
}
