/* Unicode character classes and UTF-8 helpers for the tokenizer.
 *
 * The class table comes from UnicodeData.txt through
 * scripts/gen-unicode-tables.py (generated file: common/unicode_tables.c).
 * One flags byte per code point: the general-category class in the low three
 * bits (what the pre-tokenizer regexes call \p{L}, \p{N}, ...), plus the
 * White_Space property (regex \s) and the Lu/Ll bits. */
#ifndef MR_UNICODE_H
#define MR_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum mr_ucat {
    MR_UCAT_NONE = 0, /* unassigned (Cn) or out of range */
    MR_UCAT_L = 1,    /* letter */
    MR_UCAT_N = 2,    /* number */
    MR_UCAT_P = 3,    /* punctuation */
    MR_UCAT_S = 4,    /* symbol */
    MR_UCAT_M = 5,    /* mark */
    MR_UCAT_Z = 6,    /* separator */
    MR_UCAT_C = 7,    /* control, format, private use, surrogate */
};

#define MR_UFLAG_CAT 0x07u
#define MR_UFLAG_WS 0x08u    /* White_Space */
#define MR_UFLAG_UPPER 0x10u /* Lu */
#define MR_UFLAG_LOWER 0x20u /* Ll */
#define MR_UFLAG_NFC 0x40u   /* NFC may change it (NFC_QC No/Maybe, or a combining mark) */
#define MR_UFLAG_MN 0x80u    /* Mn: nonspacing mark */

#define MR_UNICODE_MAX 0x110000u
#define MR_UNICODE_REPLACEMENT 0xFFFDu

extern const uint16_t mr_ucd_stage1[MR_UNICODE_MAX / 256];
extern const uint8_t mr_ucd_stage2[][256];
extern const uint32_t mr_ucd_lower[][2];
extern const size_t mr_ucd_lower_n;
extern const uint32_t mr_ucd_ccc[][2];
extern const size_t mr_ucd_ccc_n;
extern const uint32_t mr_ucd_decomp[][3];
extern const size_t mr_ucd_decomp_n;
extern const uint32_t mr_ucd_compose[][3];
extern const size_t mr_ucd_compose_n;

static inline unsigned mr_unicode_flags(uint32_t cp)
{
    if (cp >= MR_UNICODE_MAX)
        return 0;
    return mr_ucd_stage2[mr_ucd_stage1[cp >> 8]][cp & 0xFF];
}

static inline enum mr_ucat mr_unicode_cat(uint32_t cp)
{
    return (enum mr_ucat)(mr_unicode_flags(cp) & MR_UFLAG_CAT);
}

/* Simple lowercase mapping (UnicodeData field 13); cp itself when none. */
uint32_t mr_unicode_tolower(uint32_t cp);

/* Canonical combining class. */
unsigned mr_unicode_ccc(uint32_t cp);

/* Appends the full canonical decomposition of cp (NFD of one code point,
 * not reordered) to out[0..cap); returns its length (at most cap). */
size_t mr_unicode_decompose(uint32_t cp, uint32_t *out, size_t cap);

/* Unicode normalization form C of s[0..n).  Returns 0 when s is already in
 * NFC (*out untouched), 1 with a malloc'd *out / *out_len when it is not,
 * -1 when out of memory.  Invalid UTF-8 bytes become U+FFFD in *out. */
int mr_utf8_nfc(const char *s, size_t n, char **out, size_t *out_len);

/* Decodes one code point from s[0..n) (n >= 1).  Lenient the way common
 * tokenizers are: any lead byte followed by the right number of continuation
 * bytes decodes (overlong forms and surrogates included); a byte that starts
 * no such sequence yields MR_UNICODE_REPLACEMENT with *len = 1. */
uint32_t mr_utf8_decode(const uint8_t *s, size_t n, size_t *len);

/* Writes the UTF-8 form of cp (< 0x110000) into out; returns 1..4. */
size_t mr_utf8_encode(uint32_t cp, char out[4]);

/* The value of one hexadecimal digit, -1 for any other character (escapes
 * in grammars, regular expressions and templates). */
static inline int mr_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
