/* The key readers of hf_json.h. */
#include "engine/model/hf_json.h"

#include <errno.h>
#include <stdint.h>

#include "common/err.h"

json_t *hf_get(json_t *obj, const char *key)
{
	json_t *v = obj ? json_object_get(obj, key) : NULL;
	return json_is_null(v) ? NULL : v;
}

int hf_int(const struct hf_json *f, json_t *obj, const char *key, bool required, int def,
	   int *out, char *err, size_t errlen)
{
	json_t *v = hf_get(obj, key);
	if (!v) {
		if (required)
			return atlas_errf(err, errlen, -EINVAL, "%s: key %s: missing", f->path,
					  key);
		*out = def;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
		return atlas_errf(err, errlen, -EINVAL, "%s: key %s: not a non-negative integer",
				  f->path, key);
	*out = (int)json_integer_value(v);
	return 0;
}

int hf_double(const struct hf_json *f, json_t *obj, const char *key, bool required, double def,
	      double *out, char *err, size_t errlen)
{
	json_t *v = hf_get(obj, key);
	if (!v) {
		if (required)
			return atlas_errf(err, errlen, -EINVAL, "%s: key %s: missing", f->path,
					  key);
		*out = def;
		return 0;
	}
	if (!json_is_number(v))
		return atlas_errf(err, errlen, -EINVAL, "%s: key %s: not a number", f->path, key);
	*out = json_number_value(v);
	return 0;
}

int hf_bool(const struct hf_json *f, json_t *obj, const char *key, bool def, bool *out,
	    char *err, size_t errlen)
{
	json_t *v = hf_get(obj, key);
	if (!v) {
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v))
		return atlas_errf(err, errlen, -EINVAL, "%s: key %s: not true or false", f->path,
				  key);
	*out = json_is_true(v);
	return 0;
}
