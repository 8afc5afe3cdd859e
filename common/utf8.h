/* UTF-8 as the web and Rust define it (no overlong forms, no surrogates,
 * nothing above U+10FFFF): the one scanner that the tokenizer, the prompt
 * files and the settings share. */
#ifndef ATLAS_COMMON_UTF8_H
#define ATLAS_COMMON_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The character at s[0..n) (n > 0): its length 1..4; 0 when s ends inside
 * a character that may still be completed; negative when it is not UTF-8:
 * -i when byte i cannot continue it, -1 also for a byte that no character
 * starts with. */
int atlas_utf8_step(const uint8_t *s, size_t n);

/* Check s[0..n), which may end inside a character (text still arriving):
 * 0 with *whole the length of its complete characters, or -EILSEQ with
 * *whole the offset of the first bad byte. */
int atlas_utf8_check(const char *s, size_t n, size_t *whole);

#endif
