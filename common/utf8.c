/* UTF-8 scanning (utf8.h). */
#include "common/utf8.h"

#include <errno.h>

int atlas_utf8_step(const uint8_t *s, size_t n)
{
	uint8_t c = s[0];
	uint8_t lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
	int len;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf) {
		len = 2;
	} else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		if (c == 0xe0)
			lo = 0xa0; /* no overlong forms */
		else if (c == 0xed)
			hi = 0x9f; /* no surrogates */
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f; /* nothing above U+10FFFF */
	} else {
		return -1;
	}
	for (int i = 1; i < len; i++) {
		if ((size_t)i >= n)
			return 0;
		if (s[i] < lo || s[i] > hi)
			return -i;
		lo = 0x80;
		hi = 0xbf;
	}
	return len;
}

int atlas_utf8_check(const char *s, size_t n, size_t *whole)
{
	const uint8_t *p = (const uint8_t *)s;
	size_t i = 0;

	while (i < n) {
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		const int r = atlas_utf8_step(p + i, n - i);
		if (r > 0) {
			i += (size_t)r;
			continue;
		}
		if (r == 0 && p[i] >= 0xc2 && p[i] <= 0xf4)
			break; /* a character still arriving */
		*whole = i;
		return -EILSEQ;
	}
	*whole = i;
	return 0;
}
