/* The forwarding loop of benchmarks/link_switch.py, in C: every packet of every emulated host
 * passes through it, and in Python it took a fifth to a half of one of the 2 cores that 8 hosts'
 * compute shares (their DDP step ran 18-20 % slower than over tbf; this loop is about 10x cheaper).
 *
 *   link_switch RATE_BYTES_PER_S LATENCY_S ADDRESS=FD [ADDRESS=FD ...]
 *
 * Each FD is an open TUN device (no packet information header) whose host has ADDRESS. A packet
 * read from host i for host j is written to j's device at
 *
 *   leaves    = max(now, when i's link is free) + size / rate
 *   delivered = max(leaves + latency, when j's link is free + size / rate)
 *
 * Queues never drop, and they push back as a NIC does: a host's packets are read only while its
 * link has less than QUEUE_S of them still to send. (Reading everything at once hid the queue from
 * TCP's small-queue limit, so a sender's whole window waited here, and a ring's ACKs, sent to the
 * other neighbour, waited behind it: 8 hosts' DDP step ran 21 % slower than over tbf.)
 * Standard input closing (the benchmark ending) ends the loop. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define MAX_HOSTS 64
#define QUEUE_S 1e-3        /* what a host's link may hold before the switch stops reading it */

typedef struct {
    double due;
    uint64_t order;
    int to;
    int len;
    unsigned char *data;
} Packet;

static Packet *heap;
static size_t heap_len, heap_cap;

static int earlier(const Packet *a, const Packet *b) {
    return a->due < b->due || (a->due == b->due && a->order < b->order);
}

static void push(Packet p) {
    if (heap_len == heap_cap) {
        heap_cap = heap_cap ? 2 * heap_cap : 1024;
        heap = realloc(heap, heap_cap * sizeof(Packet));
        if (!heap) { perror("link_switch: realloc"); exit(1); }
    }
    size_t i = heap_len++;
    heap[i] = p;
    while (i > 0 && earlier(&heap[i], &heap[(i - 1) / 2])) {
        Packet t = heap[i]; heap[i] = heap[(i - 1) / 2]; heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static Packet pop(void) {
    Packet top = heap[0];
    heap[0] = heap[--heap_len];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < heap_len && earlier(&heap[l], &heap[m])) m = l;
        if (r < heap_len && earlier(&heap[r], &heap[m])) m = r;
        if (m == i) break;
        Packet t = heap[i]; heap[i] = heap[m]; heap[m] = t;
        i = m;
    }
    return top;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: link_switch RATE_BYTES_PER_S LATENCY_S ADDRESS=FD ADDRESS=FD [...]\n");
        return 2;
    }
    double rate = atof(argv[1]), latency = atof(argv[2]);
    int hosts = argc - 3;
    if (hosts > MAX_HOSTS || rate <= 0 || latency < 0) {
        fprintf(stderr, "link_switch: at most %d hosts, a positive rate and a latency >= 0\n", MAX_HOSTS);
        return 2;
    }
    uint32_t address[MAX_HOSTS];
    struct pollfd watched[MAX_HOSTS + 1];
    double link_out[MAX_HOSTS] = {0}, link_in[MAX_HOSTS] = {0};
    for (int i = 0; i < hosts; i++) {
        char *eq = strchr(argv[3 + i], '=');
        if (!eq) { fprintf(stderr, "link_switch: %s is not ADDRESS=FD\n", argv[3 + i]); return 2; }
        *eq = '\0';
        struct in_addr a;
        if (inet_pton(AF_INET, argv[3 + i], &a) != 1) { fprintf(stderr, "link_switch: bad address %s\n", argv[3 + i]); return 2; }
        address[i] = a.s_addr;
        watched[i].fd = atoi(eq + 1);
        watched[i].events = POLLIN;
    }
    watched[hosts].fd = STDIN_FILENO;
    watched[hosts].events = POLLIN;
    /* A timed wait may end up to the timer slack late (50 us by default). */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    unsigned char buffer[65536];
    uint64_t order = 0;
    for (;;) {
        /* Wake for the next delivery, or when a full link has drained enough to read its host again. */
        double t = now_s(), wake = heap_len ? heap[0].due : -1;
        for (int i = 0; i < hosts; i++) {
            int full = link_out[i] - t >= QUEUE_S;
            watched[i].events = full ? 0 : POLLIN;
            double reopens = link_out[i] - QUEUE_S;
            if (full && (wake < 0 || reopens < wake)) wake = reopens;
        }
        struct timespec wait, *waiting = NULL;
        if (wake >= 0) {
            double left = wake - t;
            if (left < 0) left = 0;
            wait.tv_sec = (time_t)left;
            wait.tv_nsec = (long)((left - (double)wait.tv_sec) * 1e9);
            waiting = &wait;
        }
        if (ppoll(watched, hosts + 1, waiting, NULL) < 0 && errno != EINTR) { perror("link_switch: ppoll"); return 1; }
        if (watched[hosts].revents) {
            ssize_t got = read(STDIN_FILENO, buffer, sizeof buffer);
            if (got <= 0) return 0;                   /* the benchmark closed our stdin: it is over */
        }
        for (int from = 0; from < hosts; from++) {
            if (!(watched[from].revents & POLLIN)) continue;
            while (link_out[from] - now_s() < QUEUE_S) {
                ssize_t len = read(watched[from].fd, buffer, sizeof buffer);
                if (len < 0) break;                   /* EAGAIN: drained */
                if (len < 20 || (buffer[0] >> 4) != 4) continue;   /* not IPv4 */
                uint32_t destination;
                memcpy(&destination, buffer + 16, 4);
                int to = -1;
                for (int j = 0; j < hosts; j++) if (address[j] == destination) { to = j; break; }
                if (to < 0) continue;
                double wire = (double)len / rate, read_at = now_s();
                link_out[from] = (link_out[from] > read_at ? link_out[from] : read_at) + wire;
                double arrives = link_out[from] + latency, free_in = link_in[to] + wire;
                link_in[to] = arrives > free_in ? arrives : free_in;
                Packet p = {link_in[to], order++, to, (int)len, malloc((size_t)len)};
                if (!p.data) { perror("link_switch: malloc"); return 1; }
                memcpy(p.data, buffer, (size_t)len);
                push(p);
            }
        }
        t = now_s();
        while (heap_len && heap[0].due <= t) {
            Packet p = pop();
            if (write(watched[p.to].fd, p.data, (size_t)p.len) < 0 && errno != EAGAIN) {
                perror("link_switch: write");
                return 1;
            }
            free(p.data);
        }
    }
}
