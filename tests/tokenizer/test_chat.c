/* tokenizer_config.json: BOS/EOS in their three spellings and the chat
 * templates atlas recognises. The templates here are short ones written for
 * the test with the traits of the real families (ChatML with and without a
 * default system message and enable_thinking, Llama 3.0 and 3.1+); the
 * expected turns are what Jinja renders from them for add_generation_prompt
 * True and enable_thinking False, worked out by hand. Qwen3's real template is
 * checked against transformers in test_ref.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "tok_testutil.h"

#define IM_END 310
#define EOT_ID 311

static const char chatml_thinking[] =
	"{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
	"message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
	"{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking "
	"is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";

static const char chatml_default_system[] =
	"{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
	"messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou "
	"are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}"
	"{%- if message.role != 'system' %}{{- '<|im_start|>' + message.role + '\\n' + "
	"message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
	"{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

static const char llama30[] =
	"{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
	"'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}{% if "
	"loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
	"{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
	"<|end_header_id|>\\n\\n' }}{% endif %}";

/* Llama 3.1 and later: a system block with dates, always. With today, the
 * date comes from strftime_now. */
static char *llama31(bool today)
{
	char *s = NULL;
	if (asprintf(&s,
		     "{{- bos_token }}{%%- if not date_string is defined %%}%s{%%- endif %%}"
		     "{%%- if messages[0]['role'] == 'system' %%}{%%- set system_message = "
		     "messages[0]['content']|trim %%}{%%- set messages = messages[1:] %%}{%%- else "
		     "%%}{%%- set system_message = \"\" %%}{%%- endif %%}{{- \"<|start_header_id|>"
		     "system<|end_header_id|>\\n\\n\" }}{{- \"Cutting Knowledge Date: December "
		     "2023\\n\" }}{{- \"Today Date: \" + date_string + \"\\n\\n\" }}{{- "
		     "system_message }}{{- \"<|eot_id|>\" }}{%%- for message in messages %%}{{- "
		     "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
		     "message['content'] | trim + '<|eot_id|>' }}{%%- endfor %%}{%%- if "
		     "add_generation_prompt %%}{{- '<|start_header_id|>assistant<|end_header_id|>"
		     "\\n\\n' }}{%%- endif %%}",
		     today ? "{%- if strftime_now is defined %}{%- set date_string = "
			     "strftime_now(\"%d %b %Y\") %}{%- else %}{%- set date_string = "
			     "\"26 Jul 2024\" %}{%- endif %}"
			   : "{%- set date_string = \"12 Mar 2025\" %}") < 0)
		abort();
	return s;
}

static json_t *special(int id, const char *content)
{
	return json_pack("{s:i, s:s, s:b}", "id", id, "content", content, "special", 1);
}

/* The tiny tokenizer with the chat tokens, and this tokenizer_config.json. */
static struct atlas_tokenizer *load(json_t *config, char **dir)
{
	json_t *extra = json_array();
	json_array_append_new(extra, special(IM_END, "<|im_end|>"));
	json_array_append_new(extra, special(EOT_ID, "<|eot_id|>"));
	json_array_append_new(extra, special(312, "<|begin_of_text|>"));
	char *text = config ? json_dumps(config, JSON_COMPACT) : NULL;
	json_decref(config);
	struct atlas_tokenizer *t = tt_tiny_load(&(struct tt_tiny){ .extra_added = extra }, text, dir);
	free(text);
	assert_non_null(t);
	return t;
}

static void expect_turn(const struct atlas_tokenizer *t, bool first, const char *system,
			const char *user, const char *want)
{
	char buf[1024];
	int n = tok_chat_turn(t, first, system, user, strlen(user), buf, sizeof buf);
	if (n < 0 || strcmp(buf, want) != 0)
		fprintf(stderr, "got  [%s]\nwant [%s]\n", n < 0 ? "(error)" : buf, want);
	assert_int_equal(n, strlen(want));
	assert_string_equal(buf, want);
}

static void test_chatml_thinking(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(json_pack("{s:n, s:s, s:s}", "bos_token", "eos_token",
						   "<|im_end|>", "chat_template", chatml_thinking),
					 &dir);
	assert_int_equal(tok_chat_style(t), TOK_CHAT_CHATML);
	assert_int_equal(tok_bos_id(t), -1);
	assert_int_equal(tok_eos_id(t), IM_END);
	assert_int_equal(tok_chat_eot_id(t), IM_END);
	expect_turn(t, true, "Be brief.", "Hi",
		    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
		    "<|im_start|>assistant\n<think>\n\n</think>\n\n");
	expect_turn(t, true, NULL, " spaced \n",
		    "<|im_start|>user\n spaced \n<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
		    "</think>\n\n");
	expect_turn(t, false, "ignored", "Again",
		    "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
		    "</think>\n\n");
	assert_string_equal(tok_chat_close(t, true), "\n");
	assert_string_equal(tok_chat_close(t, false), "<|im_end|>\n");

	/* snprintf semantics: the whole length, a truncated NUL-terminated text */
	char small[8];
	int n = tok_chat_turn(t, false, NULL, "Again", 5, small, sizeof small);
	assert_int_equal(n, strlen("<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
				   "<think>\n\n</think>\n\n"));
	assert_string_equal(small, "<|im_st");
	assert_int_equal(tok_chat_turn(t, false, NULL, "Again", 5, NULL, 0), n);
	tok_free(t);
	tt_rmdir(dir);
}

static void test_chatml_default_system(void **state)
{
	char *dir;
	json_t *list = json_pack("[{s:s, s:s}, {s:s, s:s}]", "name", "tool_use", "template",
				 "{{ tools }}", "name", "default", "template",
				 chatml_default_system);
	struct atlas_tokenizer *t = load(json_pack("{s:{s:s}, s:o}", "eos_token", "content",
						   "<|im_end|>", "chat_template", list),
					 &dir);
	assert_int_equal(tok_chat_style(t), TOK_CHAT_CHATML);
	assert_int_equal(tok_eos_id(t), IM_END);
	expect_turn(t, true, "", "Hi",
		    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
		    "Hi<|im_end|>\n<|im_start|>assistant\n");
	expect_turn(t, true, "Mine.", "Hi",
		    "<|im_start|>system\nMine.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
		    "<|im_start|>assistant\n");
	expect_turn(t, false, NULL, "Hi", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
	tok_free(t);
	tt_rmdir(dir);
}

static void test_llama30(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(json_pack("{s:s, s:s, s:s}", "bos_token",
						   "<|begin_of_text|>", "eos_token", "<|eot_id|>",
						   "chat_template", llama30),
					 &dir);
	assert_int_equal(tok_chat_style(t), TOK_CHAT_LLAMA3);
	assert_int_equal(tok_bos_id(t), 312);
	assert_int_equal(tok_chat_eot_id(t), EOT_ID);
	expect_turn(t, true, NULL, "  Hi there \n",
		    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
		    "<|start_header_id|>assistant<|end_header_id|>\n\n");
	expect_turn(t, true, "\tSys ", "Q",
		    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>"
		    "<|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
		    "<|start_header_id|>assistant<|end_header_id|>\n\n");
	expect_turn(t, false, NULL, "Q2",
		    "<|start_header_id|>user<|end_header_id|>\n\nQ2<|eot_id|>"
		    "<|start_header_id|>assistant<|end_header_id|>\n\n");
	assert_string_equal(tok_chat_close(t, true), "");
	assert_string_equal(tok_chat_close(t, false), "<|eot_id|>");
	tok_free(t);
	tt_rmdir(dir);
}

static void test_llama31_dates(void **state)
{
	char *dir, *tmpl = llama31(false);
	struct atlas_tokenizer *t = load(json_pack("{s:{s:s}, s:s}", "bos_token", "content",
						   "<|begin_of_text|>", "chat_template", tmpl),
					 &dir);
	free(tmpl);
	expect_turn(t, true, NULL, "Hi",
		    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
		    "Date: December 2023\nToday Date: 12 Mar 2025\n\n<|eot_id|><|start_header_id|>"
		    "user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
		    "<|end_header_id|>\n\n");
	tok_free(t);
	tt_rmdir(dir);

	/* strftime_now: today's date, as transformers renders it */
	tmpl = llama31(true);
	t = load(json_pack("{s:s, s:s}", "bos_token", "<|begin_of_text|>", "chat_template", tmpl),
		 &dir);
	free(tmpl);
	char date[32], want[512];
	time_t now = time(NULL);
	struct tm tm;
	localtime_r(&now, &tm);
	strftime(date, sizeof date, "%d %b %Y", &tm);
	snprintf(want, sizeof want,
		 "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
		 "Date: December 2023\nToday Date: %s\n\nBe kind.<|eot_id|><|start_header_id|>user"
		 "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
		 date);
	expect_turn(t, true, "Be kind.\n", "Hi", want);
	tok_free(t);
	tt_rmdir(dir);
}

static void test_template_file_and_none(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(NULL, &dir);
	char buf[64];
	assert_int_equal(tok_chat_style(t), TOK_CHAT_NONE);
	assert_int_equal(tok_chat_turn(t, true, NULL, "x", 1, buf, sizeof buf), -ENOTSUP);
	assert_int_equal(tok_chat_eot_id(t), -1);
	assert_int_equal(tok_bos_id(t), -1);
	assert_int_equal(tok_eos_id(t), -1);
	assert_string_equal(tok_chat_close(t, false), "");
	tok_free(t);
	tt_rmdir(dir);

	/* A config without chat_template, and the template in its own file. */
	dir = tt_tmpdir();
	json_t *extra = json_array();
	json_array_append_new(extra, special(EOT_ID, "<|eot_id|>"));
	tt_write_json(dir, "tokenizer.json", tt_tiny_json(&(struct tt_tiny){ .extra_added = extra }));
	tt_write(dir, "tokenizer_config.json", "{\"eos_token\": \"<nope>\", \"bos_token\": null}");
	tt_write(dir, "chat_template.jinja", llama30);
	char err[512];
	assert_int_equal(tok_load(dir, &t, err, sizeof err), 0);
	assert_int_equal(tok_chat_style(t), TOK_CHAT_LLAMA3);
	assert_int_equal(tok_eos_id(t), -1); /* not a token */
	/* no bos_token: the template's bos_token renders as nothing */
	expect_turn(t, true, NULL, "Hi",
		    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
		    "<|start_header_id|>assistant<|end_header_id|>\n\n");
	tok_free(t);
	tt_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chatml_thinking),
		cmocka_unit_test(test_chatml_default_system),
		cmocka_unit_test(test_llama30),
		cmocka_unit_test(test_llama31_dates),
		cmocka_unit_test(test_template_file_and_none),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
