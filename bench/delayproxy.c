/* bench.hotnode's delay proxy: `delayproxy DELAY_US HOST:PORT...`.
 *
 * A TCP proxy in front of each target (a listener on 127.0.0.1, its address printed
 * on stdout, one line per target, in order), one epoll loop for all: each chunk read
 * from either end is sent to the other end DELAY_US microseconds after it was read,
 * in order.  The delay is the same for every chunk, so one FIFO of chunks is in due
 * order: no heap.  The loop sleeps in epoll_wait; a timerfd armed (absolute,
 * CLOCK_MONOTONIC) for the first chunk's due time wakes it with microseconds (an
 * epoll timeout rounds up to whole milliseconds).  Chunks due together to one
 * socket leave in one send.  An end's close (its end of data) reaches its peer after
 * the delay, as a chunk would: the peer's writing side is shut once it has taken
 * what it was owed, so each direction ends on its own (a half-close passes through);
 * once both have, or on an error, both sockets close.
 * Runs until its stdin is readable or at its end (the parent holding the pipe's
 * other end exits; a terminal's user types), or until killed; a file as stdin (such
 * as /dev/null) is not watched.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 65536
#define READ_SIZE 65536

struct chunk {                 /* what one end read, for its peer */
    struct chunk *next;
    int64_t due;               /* ns, CLOCK_MONOTONIC */
    int fd;                    /* the peer it goes to */
    uint32_t gen;              /* the peer's generation: is it still that socket? */
    size_t len;                /* 0: the reading end's close */
    char data[];
};

struct conn {
    int open, peer, ended;     /* ended: its close was read, no longer read from */
    int closing;               /* its peer's end came: shut writing once out is sent */
    int shut;                  /* its writing side is shut */
    int dirty;                 /* on the dirty list: something to send this round */
    int want_out;              /* owed data the socket could not take yet */
    int events;                /* what epoll watches it for; 0: not registered */
    uint32_t gen;
    char *out;                 /* what it is owed and has not taken yet */
    size_t len, cap;
};

static struct conn conns[MAX_FDS];
static struct chunk *head, **tail = &head;
static int dirty[MAX_FDS], ndirty;
static int epfd, tfd, nlisten;
static int listen_fd[64];
static struct addrinfo *target[64];
static int64_t delay_ns, armed = -1;

static void die(const char *what) {
    perror(what);
    exit(1);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void watch(int fd, int op, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.fd = fd};
    if (epoll_ctl(epfd, op, fd, &ev) < 0)
        die("epoll_ctl");
}

/* Watch a connection for reading until its close was read, for writing while it is
 * owed data it could not take; not at all when neither (an unwatched socket cannot
 * report a hang-up over and over). */
static void rewatch(int fd) {
    struct conn *c = &conns[fd];
    int events = (c->ended ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0);
    if (events == c->events)
        return;
    if (!events)
        watch(fd, EPOLL_CTL_DEL, 0);
    else
        watch(fd, c->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, (uint32_t)events);
    c->events = events;
}

static void close_one(int fd) {
    struct conn *c = &conns[fd];
    free(c->out);
    c->out = NULL;
    c->len = c->cap = 0;
    c->open = c->ended = c->closing = c->shut = c->want_out = 0;
    c->gen++;
    close(fd);
}

static void close_pair(int fd) {
    int peer = conns[fd].peer;
    close_one(fd);
    if (peer >= 0 && conns[peer].open)
        close_one(peer);
}

/* Send what fd is owed (then its end, if that came); watch EPOLLOUT while some is
 * left. */
static void flush(int fd) {
    struct conn *c = &conns[fd];
    while (c->len) {
        ssize_t n = send(fd, c->out, c->len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n < 0) {
            close_pair(fd);
            return;
        }
        memmove(c->out, c->out + n, c->len - (size_t)n);
        c->len -= (size_t)n;
    }
    if (!c->len && c->closing && !c->shut) {
        shutdown(fd, SHUT_WR);
        c->shut = 1;
        if (conns[c->peer].shut) {
            close_pair(fd);
            return;
        }
    }
    c->want_out = c->len > 0;
    rewatch(fd);
}

static void owe(struct conn *c, const char *data, size_t len) {
    if (c->len + len > c->cap) {
        c->cap = (c->len + len) * 2;
        c->out = realloc(c->out, c->cap);
        if (!c->out)
            die("realloc");
    }
    memcpy(c->out + c->len, data, len);
    c->len += len;
}

/* Read what came to fd and queue it for the peer; at the end, queue the close. */
static void read_end(int fd) {
    static char buf[READ_SIZE];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n < 0)
        n = 0;
    struct chunk *ch = malloc(sizeof *ch + (size_t)n);
    if (!ch)
        die("malloc");
    int peer = conns[fd].peer;
    *ch = (struct chunk){.due = now_ns() + delay_ns, .fd = peer, .gen = conns[peer].gen,
                         .len = (size_t)n};
    memcpy(ch->data, buf, (size_t)n);
    *tail = ch;
    tail = &ch->next;
    if (n == 0) {
        conns[fd].ended = 1;
        rewatch(fd);
    }
}

static void setup(int fd, int peer) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct conn *c = &conns[fd];
    c->open = 1;
    c->peer = peer;
    c->events = 0;
    rewatch(fd);
}

static void accept_one(int i) {
    int down = accept4(listen_fd[i], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (down < 0)
        return;
    struct addrinfo *a = target[i];
    int up = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (up < 0 || up >= MAX_FDS || down >= MAX_FDS || connect(up, a->ai_addr, a->ai_addrlen) < 0) {
        if (up >= 0)
            close(up);
        close(down);
        return;
    }
    if (fcntl(up, F_SETFL, fcntl(up, F_GETFL) | O_NONBLOCK) < 0)
        die("fcntl");
    setup(down, up);
    setup(up, down);
}

/* Hand every due chunk to its socket, then send each socket's in one go. */
static void deliver(void) {
    int64_t now = now_ns();
    while (head && head->due <= now) {
        struct chunk *ch = head;
        head = ch->next;
        if (!head)
            tail = &head;
        struct conn *c = &conns[ch->fd];
        if (c->open && c->gen == ch->gen) {
            if (ch->len)
                owe(c, ch->data, ch->len);
            else
                c->closing = 1;
            if (!c->dirty) {
                c->dirty = 1;
                dirty[ndirty++] = ch->fd;
            }
        }
        free(ch);
    }
    for (int i = 0; i < ndirty; i++) {
        int fd = dirty[i];
        conns[fd].dirty = 0;
        if (conns[fd].open)
            flush(fd);
    }
    ndirty = 0;
}

static void arm(void) {
    int64_t due = head ? head->due : 0;
    if (due == armed)
        return;
    struct itimerspec it = {.it_value = {.tv_sec = due / 1000000000, .tv_nsec = due % 1000000000}};
    if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &it, NULL) < 0)
        die("timerfd_settime");
    armed = due;
}

static int listen_on(const char *spec, int i) {
    char host[256];
    const char *colon = strrchr(spec, ':');
    if (!colon || (size_t)(colon - spec) >= sizeof host) {
        fprintf(stderr, "delayproxy: not HOST:PORT: %s\n", spec);
        exit(2);
    }
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = 0;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    int err = getaddrinfo(host, colon + 1, &hints, &target[i]);
    if (err) {
        fprintf(stderr, "delayproxy: %s: %s\n", spec, gai_strerror(err));
        exit(2);
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 128) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
        die("listen");
    printf("127.0.0.1:%d\n", ntohs(sa.sin_port));
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc - 2 > 64) {
        fprintf(stderr, "usage: delayproxy DELAY_US HOST:PORT... (at most 64)\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    delay_ns = strtoll(argv[1], NULL, 10) * 1000;
    if ((epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
        die("epoll_create1");
    if ((tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) < 0)
        die("timerfd_create");
    watch(tfd, EPOLL_CTL_ADD, EPOLLIN);
    struct epoll_event in = {.events = EPOLLIN, .data.fd = STDIN_FILENO};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, STDIN_FILENO, &in) < 0 && errno != EPERM)
        die("epoll_ctl stdin");  /* EPERM: a file (/dev/null), which never ends */
    nlisten = argc - 2;
    for (int i = 0; i < nlisten; i++) {
        listen_fd[i] = listen_on(argv[i + 2], i);
        watch(listen_fd[i], EPOLL_CTL_ADD, EPOLLIN);
    }
    fflush(stdout);
    struct epoll_event evs[256];
    for (;;) {
        int n = epoll_wait(epfd, evs, 256, -1);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == STDIN_FILENO)
                return 0;
            if (fd == tfd) {
                uint64_t ticks;
                ssize_t r = read(tfd, &ticks, sizeof ticks);
                (void)r;
                armed = -1;
                continue;
            }
            int l = 0;
            while (l < nlisten && listen_fd[l] != fd)
                l++;
            if (l < nlisten) {
                accept_one(l);
                continue;
            }
            if (conns[fd].open && (evs[i].events & EPOLLOUT))
                flush(fd);
            if (conns[fd].open && !conns[fd].ended && (evs[i].events & ~(uint32_t)EPOLLOUT))
                read_end(fd);
        }
        deliver();
        arm();
    }
}
