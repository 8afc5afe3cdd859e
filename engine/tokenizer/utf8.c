/* UTF-8 scanning as Rust's str and from_utf8_lossy see it, the character
 * classes that tokenizers' added-token matching uses, and GPT-2's byte map. */
#include "engine/tokenizer/internal.h"

#include <utf8proc.h>

#include "common/utf8.h"

int tok_utf8_step(const uint8_t *s, size_t n)
{
	return atlas_utf8_step(s, n);
}

bool tok_utf8_valid(const char *s, size_t n)
{
	size_t whole;
	return atlas_utf8_check(s, n, &whole) == 0 && whole == n;
}

int32_t tok_utf8_cp(const char *s, size_t n, int *len)
{
	utf8proc_int32_t cp;
	utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &cp);
	if (r <= 0) {
		*len = 1;
		return -1;
	}
	*len = (int)r;
	return cp;
}

int32_t tok_utf8_last_cp(const char *s, size_t n)
{
	if (!n)
		return -1;
	size_t i = n - 1;
	while (i > 0 && ((uint8_t)s[i] & 0xc0) == 0x80)
		i--;
	int len;
	return tok_utf8_cp(s + i, n - i, &len);
}

bool tok_is_space(int32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 ||
	       cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
	       cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

bool tok_is_word(int32_t cp)
{
	if (cp < 0)
		return false;
	if (cp < 0x80)
		return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') ||
		       (cp >= 'A' && cp <= 'Z') || cp == '_';
	switch (utf8proc_category(cp)) {
	case UTF8PROC_CATEGORY_LU:
	case UTF8PROC_CATEGORY_LL:
	case UTF8PROC_CATEGORY_LT:
	case UTF8PROC_CATEGORY_LM:
	case UTF8PROC_CATEGORY_LO:
	case UTF8PROC_CATEGORY_MN:
	case UTF8PROC_CATEGORY_MC:
	case UTF8PROC_CATEGORY_ME:
	case UTF8PROC_CATEGORY_ND:
	case UTF8PROC_CATEGORY_NL:
	case UTF8PROC_CATEGORY_PC:
		return true;
	default:
		break;
	}
	/* Join_Control, and the symbols that Unicode counts as Other_Alphabetic
	 * (circled and squared Latin letters). */
	return cp == 0x200c || cp == 0x200d || (cp >= 0x24b6 && cp <= 0x24e9) ||
	       (cp >= 0x1f130 && cp <= 0x1f149) || (cp >= 0x1f150 && cp <= 0x1f169) ||
	       (cp >= 0x1f170 && cp <= 0x1f189);
}

size_t tok_utf8_lossy(const uint8_t *s, size_t n, char *out)
{
	size_t i = 0, o = 0;
	while (i < n) {
		int r = s[i] < 0x80 ? 1 : tok_utf8_step(s + i, n - i);
		if (r > 0) {
			for (int k = 0; k < r; k++)
				out[o++] = (char)s[i + (size_t)k];
			i += (size_t)r;
			continue;
		}
		/* An unfinished character at the end is one invalid sequence. */
		i += r < 0 ? (size_t)-r : n - i;
		out[o++] = (char)0xef;
		out[o++] = (char)0xbf;
		out[o++] = (char)0xbd;
	}
	return o;
}

/* GPT-2 keeps the printable Latin-1 bytes as their own characters and moves
 * the others (controls, space, DEL, NBSP, soft hyphen) to U+0100 upwards, in
 * byte order. */
static bool byte_is_printable(unsigned b)
{
	return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
}

uint16_t tok_byte_to_cp(uint8_t b)
{
	if (byte_is_printable(b))
		return b;
	if (b <= 0x20)
		return (uint16_t)(0x100 + b);
	if (b <= 0xa0)
		return (uint16_t)(0x100 + 33 + (b - 0x7f));
	return 0x100 + 67; /* 0xad */
}

int tok_cp_to_byte(int32_t cp)
{
	if (cp >= 0 && cp < 0x100)
		return byte_is_printable((unsigned)cp) ? cp : -1;
	int k = cp - 0x100;
	if (k < 0 || k > 67)
		return -1;
	if (k <= 32)
		return k;
	if (k <= 66)
		return 0x7f + (k - 33);
	return 0xad;
}
