/* The stop-string scan (stop.h). */
#include "engine/text/stop.h"

#include <string.h>

long stop_scan(const char *buf, size_t len, const char stops[][ATLAS_STOP_LEN], int n_stop,
	       size_t *releasable)
{
	size_t hold = len;
	for (size_t i = 0; i < len; i++) {
		for (int s = 0; s < n_stop; s++) {
			size_t sl = strlen(stops[s]);
			if (sl == 0)
				continue;
			size_t avail = len - i;
			if (avail >= sl) {
				if (memcmp(buf + i, stops[s], sl) == 0) {
					*releasable = i;
					return (long)i;
				}
			} else if (hold == len && memcmp(buf + i, stops[s], avail) == 0) {
				hold = i;
			}
		}
	}
	*releasable = hold;
	return -1;
}
