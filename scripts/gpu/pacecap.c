/* Caps every TCP connection a process makes or accepts at one rate, as the sender's own pacing
 * (SO_MAX_PACING_RATE): the way clouds cap each flow, without a qdisc whose one lock every
 * packet of the machine must take (HTB classes on lo cost both transports 2.7-2.9x where no
 * cap bound; BENCHMARKS.md). Since Linux 4.13 TCP paces a socket that asks for it by itself
 * where no fq qdisc does.
 *
 *     cc -O2 -shared -fPIC -o pacecap.so pacecap.c -ldl
 *     LD_PRELOAD=$PWD/pacecap.so PACECAP_MBIT=250 COMMAND ...
 *
 * PACECAP_MBIT: the rate in Mbit/s (unset or 0: no cap). Where PACECAP_LOG names a file, a
 * process that capped sockets adds a line to it at exit ("PID capped N sockets at R Mbit/s").
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static atomic_uint capped;
static atomic_uint failed;

static unsigned rate_bytes(void) {
    const char *v = getenv("PACECAP_MBIT");
    unsigned long mbit = v ? strtoul(v, NULL, 10) : 0;
    unsigned long bytes = mbit * 125000UL;
    return bytes > 0xfffffffeUL ? 0xfffffffeU : (unsigned)bytes;
}

static void cap(int fd) {
    unsigned rate = rate_bytes();
    int type = 0, domain = 0;
    socklen_t len = sizeof(type), dlen = sizeof(domain);
    if (fd < 0 || rate == 0 || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) || type != SOCK_STREAM ||
        getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dlen) || (domain != AF_INET && domain != AF_INET6))
        return;
    if (setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)) == 0)
        atomic_fetch_add(&capped, 1);
    else
        atomic_fetch_add(&failed, 1);
}

int socket(int domain, int type, int protocol) {
    static int (*real)(int, int, int);
    if (!real)
        real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
    int fd = real(domain, type, protocol);
    cap(fd);
    return fd;
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real)
        real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    int c = real(fd, addr, len);
    cap(c);
    return c;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real)
        real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    int c = real(fd, addr, len, flags);
    cap(c);
    return c;
}

__attribute__((destructor)) static void report(void) {
    const char *path = getenv("PACECAP_LOG");
    if (!path || (atomic_load(&capped) == 0 && atomic_load(&failed) == 0))
        return;
    FILE *f = fopen(path, "a");
    if (!f)
        return;
    fprintf(f, "%d capped %u sockets at %s Mbit/s (%u refused)\n", (int)getpid(), atomic_load(&capped),
            getenv("PACECAP_MBIT") ? getenv("PACECAP_MBIT") : "0", atomic_load(&failed));
    fclose(f);
}
