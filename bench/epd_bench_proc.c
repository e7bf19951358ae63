/*
 * epd_bench_proc.c — what the benchmarks that start their own cluster do
 * alike: find their own bin folder, spawn a process (a daemon with its log,
 * a reference tool with its output captured), wait for its ready line,
 * stop it, make the cluster secret, wait until the router lists the workers READY,
 * and write a small `sim` model.  Plain processes and files; every wait
 * has a timeout.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "epd_alloc.h"
#include "epd_bench.h"
#include "epd_msg.h"
#include "epd_rng.h"
#include "epd_rpc.h"
#include "epd_time.h"

int epd_bench_bindir(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    char *slash;

    if (n <= 0) {
        return -1;
    }
    out[n] = '\0';
    slash = strrchr(out, '/');
    if (slash != NULL) {
        *slash = '\0';
    }
    return 0;
}

void epd_bench_setenv(const char *const *env, int overwrite)
{
    for (size_t i = 0; env != NULL && env[i] != NULL; i++) {
        char buf[512];
        char *eq;

        snprintf(buf, sizeof(buf), "%s", env[i]);
        eq = strchr(buf, '=');
        if (eq != NULL) {
            *eq = '\0';
            setenv(buf, eq + 1, overwrite);
        }
    }
}

/* The children spawned and not reaped yet (0: a free slot).  Lock-free:
 * soak spawns from its chaos thread too, and the signal handler reads it.
 * Past EPD_BENCH_CHILDREN_MAX at once a child is simply not remembered. */
#define EPD_BENCH_CHILDREN_MAX 1024
static atomic_int epd_bench_children[EPD_BENCH_CHILDREN_MAX];
static atomic_flag epd_bench_handlers_set = ATOMIC_FLAG_INIT;

static void epd_bench_remember(pid_t pid)
{
    for (int i = 0; i < EPD_BENCH_CHILDREN_MAX; i++) {
        int zero = 0;

        if (atomic_compare_exchange_strong(&epd_bench_children[i], &zero, (int)pid)) {
            return;
        }
    }
}

static void epd_bench_forget(pid_t pid)
{
    for (int i = 0; i < EPD_BENCH_CHILDREN_MAX; i++) {
        int want = (int)pid;

        if (atomic_compare_exchange_strong(&epd_bench_children[i], &want, 0)) {
            return;
        }
    }
}

/* SIGINT / SIGTERM / SIGHUP: SIGTERM to every remembered child still
 * running (waitpid says so: one reaped elsewhere, or a pid reused by
 * another process, is not ours and is left alone), then the signal's
 * default action.  Async-signal-safe calls only. */
static void epd_bench_on_signal(int sig)
{
    int saved = errno;

    for (int i = 0; i < EPD_BENCH_CHILDREN_MAX; i++) {
        int pid = atomic_load(&epd_bench_children[i]);
        int status;

        if (pid > 0 && waitpid((pid_t)pid, &status, WNOHANG) == 0) {
            kill((pid_t)pid, SIGTERM);
        }
    }
    errno = saved;
    signal(sig, SIG_DFL);
    raise(sig);
}

static void epd_bench_set_handlers(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction sa;

    if (atomic_flag_test_and_set(&epd_bench_handlers_set)) {
        return;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = epd_bench_on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        sigaction(sigs[i], &sa, NULL);
    }
}

pid_t epd_bench_reap(pid_t pid, int *status_p, int options)
{
    pid_t r = waitpid(pid, status_p, options);

    if (r == pid) {
        epd_bench_forget(pid);
    }
    return r;
}

pid_t epd_bench_spawn_ex(char *const argv[], const epd_bench_spawn_t *how)
{
    pid_t pid;

    epd_bench_set_handlers();
    pid = fork();

    if (pid == 0) {
        if (how->log != NULL) {
            int fd = open(how->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
            }
        } else {
            int devnull = open("/dev/null", O_RDWR);

            dup2(how->out_fd >= 0 ? how->out_fd : devnull, 1);
            dup2(devnull, 2);
            if (devnull > 2) {
                close(devnull);
            }
        }
        epd_bench_setenv(how->env_default, 0);
        epd_bench_setenv(how->env, 1);
        /* a name with a '/' runs as it is; one without (a reference tool)
         * is looked up in PATH */
        execvp(argv[0], argv);
        _exit(127);
    }
    if (pid > 0) {
        epd_bench_remember(pid);
    }
    return pid;
}

pid_t epd_bench_spawn(char *const argv[], const char *log)
{
    static const char *const loopback[] = {"UCX_TLS=posix,cma,tcp", "UCX_NET_DEVICES=lo", NULL};
    epd_bench_spawn_t how = {.log = log, .out_fd = -1, .env_default = loopback, .env = NULL};

    return epd_bench_spawn_ex(argv, &how);
}

int epd_bench_stop(pid_t pid, uint32_t timeout_ms, const char *who, const char *name)
{
    uint64_t end;
    int status;

    if (pid <= 0) {
        return -1;
    }
    kill(pid, SIGTERM);
    end = epd_time_now_ns() + (uint64_t)timeout_ms * EPD_NSEC_PER_MSEC;
    while (epd_time_now_ns() < end) {
        if (epd_bench_reap(pid, &status, WNOHANG) == pid) {
            /* a daemon that crashed on the way out is a bug worth a line */
            if (WIFSIGNALED(status)) {
                fprintf(stderr, "%s: %s (pid %d) died of signal %d on SIGTERM\n", who, name,
                        (int)pid, WTERMSIG(status));
                return -1;
            }
            if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
                fprintf(stderr, "%s: %s (pid %d) exited %d on SIGTERM\n", who, name, (int)pid,
                        WEXITSTATUS(status));
                return -1;
            }
            return 0;
        }
        epd_time_sleep_ns(10 * EPD_NSEC_PER_MSEC);
    }
    if (timeout_ms % 1000 == 0) {
        fprintf(stderr, "%s: %s (pid %d) did not exit within %u s of SIGTERM: killed\n", who, name,
                (int)pid, timeout_ms / 1000);
    } else {
        fprintf(stderr, "%s: %s (pid %d) did not exit within %u ms of SIGTERM: killed\n", who, name,
                (int)pid, timeout_ms);
    }
    kill(pid, SIGKILL);
    (void)epd_bench_reap(pid, &status, 0);
    return -1;
}

void epd_bench_kill(pid_t pid, const char *who, const char *name)
{
    (void)epd_bench_stop(pid, 10000, who, name);
}

int epd_bench_wait_ready(const char *path, pid_t pid, const char *key, char *out, size_t cap)
{
    uint64_t end = epd_time_now_ns() + 120 * EPD_NSEC_PER_SEC;
    size_t kl = strlen(key);
    int status;

    while (epd_time_now_ns() < end) {
        FILE *f = fopen(path, "r");

        if (f != NULL) {
            char line[512];
            char *p;

            if (fgets(line, sizeof(line), f) != NULL && (p = strstr(line, key)) != NULL &&
                p[kl] == '=') {
                size_t n = strcspn(p + kl + 1, " \n");

                fclose(f);
                if (n >= cap) {
                    return -1;
                }
                memcpy(out, p + kl + 1, n);
                out[n] = '\0';
                return 0;
            }
            fclose(f);
        }
        if (epd_bench_reap(pid, &status, WNOHANG) == pid) {
            return -1;
        }
        epd_time_sleep_ns(20 * EPD_NSEC_PER_MSEC);
    }
    return -1;
}

int epd_bench_make_secret(const char *dir, char *path, size_t cap, epd_secret_t *secret,
                          const char *who)
{
    unsigned char key[32];
    char why[256];
    int fd;

    snprintf(path, cap, "%s/cluster-secret", dir);
    for (size_t i = 0; i < sizeof(key); i += 8) {
        uint64_t v = epd_rng_entropy();
        memcpy(key + i, &v, 8);
    }
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, key, sizeof(key)) != (ssize_t)sizeof(key) || close(fd) != 0) {
        fprintf(stderr, "%s: cannot write %s: %s\n", who, path, strerror(errno));
        return -1;
    }
    if (epd_secret_load(path, secret, why, sizeof(why)) != EPD_OK) {
        fprintf(stderr, "%s: %s\n", who, why);
        return -1;
    }
    return 0;
}

int epd_bench_wait_workers(const char *ctl, const epd_secret_t *secret, int want)
{
    epd_rpc_client_t *c = NULL;
    uint64_t end = epd_time_now_ns() + 30 * EPD_NSEC_PER_SEC;
    int ready = 0;

    if (epd_rpc_client_create(ctl, &c) != EPD_OK) {
        return -1;
    }
    if (epd_rpc_client_set_auth(c, secret->bytes, secret->len) != EPD_OK) {
        epd_rpc_client_destroy(c);
        return -1;
    }
    while (epd_time_now_ns() < end) {
        void *resp = NULL;
        size_t len = 0;
        ProtobufCMessage *m = NULL;

        if (epd_rpc_call(c, EPD_RPC_STATUS, NULL, 0, 1000, &resp, &len, NULL, 0) == EPD_OK &&
            epd_proto_unpack(&epd__status_response__descriptor, resp, len, &m) == EPD_OK) {
            Epd__StatusResponse *s = (Epd__StatusResponse *)m;

            ready = 0;
            for (size_t i = 0; i < s->n_workers; i++) {
                ready += s->workers[i]->state == EPD__WORKER_STATE__WORKER_STATE_READY;
            }
            epd_proto_free(m);
        }
        epd_free(resp);
        if (ready >= want) {
            break;
        }
        epd_time_sleep_ns(100 * EPD_NSEC_PER_MSEC);
    }
    epd_rpc_client_destroy(c);
    return ready >= want ? 0 : -1;
}

int epd_bench_write_sim(const char *dir)
{
    return epd_bench_write_sim_ctx(dir, 4096);
}

int epd_bench_write_sim_ctx(const char *dir, uint32_t max_context)
{
    char path[4096 + 32];
    FILE *f;

    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        return -1;
    }
    snprintf(path, sizeof(path), "%s/serve.profile", dir);
    f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f, "name = serve-1b\nn_layers = 4\nlayer_pattern = A\nhidden = 2048\nn_heads = 16\n"
               "n_kv_heads = 4\nhead_dim = 64\nkv_dtype = BF16\nstate_bytes = 0\n"
               "active_params = 1.0e9\ntotal_params = 1.0e9\nweight_bytes = 2\nvocab = 258\n"
               "max_context = %u\n",
            max_context);
    fclose(f);
    snprintf(path, sizeof(path), "%s/h200.profile", dir);
    f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f, "name = h200\nflops = 5.94e14\nmem_bw = 4.08e12\nhbm_bytes = 141e9\n");
    fclose(f);
    snprintf(path, sizeof(path), "%s/sim.conf", dir);
    f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f, "model = serve.profile\naccel = h200.profile\nscale = 1\ndevices = 1\n"
               "mode = sleep\nseed = 1\n");
    fclose(f);
    return 0;
}

int epd_bench_metric(const char *text, const char *name, double *out)
{
    size_t nl = strlen(name);

    for (const char *p = text; p != NULL && *p != '\0';) {
        const char *eol = strchr(p, '\n');
        const char *q = p + nl;

        if (*p != '#' && strncmp(p, name, nl) == 0) {
            if (strncmp(q, "{model=\"", 8) == 0) {
                /* skip the (escaped) value to its closing quote */
                for (q += 8; *q != '\0' && *q != '\n' && *q != '"'; q++) {
                    if (*q == '\\' && q[1] != '\0' && q[1] != '\n') {
                        q++;
                    }
                }
                q = *q == '"' && q[1] == '}' ? q + 2 : NULL;
            }
            if (q != NULL && *q == ' ') {
                *out = strtod(q + 1, NULL);
                return 1;
            }
        }
        p = eol != NULL ? eol + 1 : NULL;
    }
    return 0;
}
