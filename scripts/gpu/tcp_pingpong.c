/* What a plain TCP socket takes for a small message on this machine, as the floor under
 * NCCL's Socket transport and the plugin's tcp providers: `tcp_pingpong ADDR PORT SIZE ITERS`
 * forks a server and a client on ADDR:PORT (TCP_NODELAY; send and recv with MSG_DONTWAIT,
 * retried until done, as NCCL's Socket transport polls its sockets) and prints the one-way
 * time per message in microseconds (round trips / 2), after 1000 warm-up round trips.
 * Build: cc -O2 -o tcp_pingpong tcp_pingpong.c */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void full(int fd, char *buf, size_t n, int sending) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = sending ? send(fd, buf + done, n - done, MSG_DONTWAIT)
                        : recv(fd, buf + done, n - done, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r <= 0) { perror(sending ? "send" : "recv"); exit(1); }
    done += (size_t)r;
  }
}

static int nodelay(int fd) {
  int one = 1;
  return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int main(int argc, char **argv) {
  if (argc != 5) { fprintf(stderr, "usage: %s ADDR PORT SIZE ITERS\n", argv[0]); return 2; }
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2]))};
  if (inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1) { fprintf(stderr, "bad address\n"); return 2; }
  size_t size = strtoul(argv[3], NULL, 10);
  long iters = atol(argv[4]);
  char *buf = calloc(1, size ? size : 1);
  int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1)) { perror("listen"); return 1; }
  pid_t server = fork();
  if (server == 0) {
    int fd = accept(ls, NULL, NULL);
    nodelay(fd);
    for (long i = 0; i < iters + 1000; i++) {
      full(fd, buf, size, 0);
      full(fd, buf, size, 1);
    }
    return 0;
  }
  close(ls);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) { perror("connect"); return 1; }
  nodelay(fd);
  struct timespec t0, t1;
  for (long i = 0; i < iters + 1000; i++) {
    if (i == 1000) clock_gettime(CLOCK_MONOTONIC, &t0);
    full(fd, buf, size, 1);
    full(fd, buf, size, 0);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double us = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / 1e3;
  printf("tcp_pingpong %zu bytes: %.2f us one way (%ld round trips)\n", size, us / (double)iters / 2, iters);
  waitpid(server, NULL, 0);
  return 0;
}
