/* Telling systemd (a unit of Type=notify) that atlasd is mounted, or is
 * stopping. */
#ifndef ATLAS_APPLIANCE_NOTIFY_H
#define ATLAS_APPLIANCE_NOTIFY_H

/* Send state ("READY=1", "STOPPING=1") to $NOTIFY_SOCKET; 0 without one,
 * else 0 or a negative errno. */
int notify_systemd(const char *state);

#endif
