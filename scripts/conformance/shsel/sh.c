/*
 * /bin/sh of the substitute busybox images: busybox's ash, as in the
 * upstream images, unless the environment holds a variable whose name is
 * not a shell identifier (EnvFrom makes such names, "data-1"). Debian's
 * busybox 1.35 ash drops those before running anything, where upstream
 * busybox 1.37 passes them on, so such a shell is bash. Everything else
 * (error messages: "can't create /file") is ash's, as the specs expect.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static int identifier(const char *kv) {
	const char *p = kv;
	if (!(*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
		return 0;
	for (p++; *p && *p != '='; p++)
		if (!(*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
			return 0;
	return 1;
}

int main(int argc, char **argv) {
	(void)argc;
	for (char **e = environ; *e; e++) {
		if (!identifier(*e)) {
			execv("/bin/bash", argv);
			perror("/bin/bash");
			return 127;
		}
	}
	execv("/bin/busybox", argv); /* busybox runs the applet named by argv[0]: sh */
	perror("/bin/busybox");
	return 127;
}
