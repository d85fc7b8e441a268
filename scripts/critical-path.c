// The critical path of a ping-pong hop, in user-space instructions (issue
// 12's 8 B busy row, session 34): every traced task is single-stepped from
// the return of a read-class system call that brought data (read, readv,
// recvfrom, recvmsg returning > 0) to its next system call instruction; an
// interval that ends at a write-class call (write, writev, sendto, sendmsg)
// is a sample: the instructions between the answer's arrival and its
// send, which no other work overlaps. In a busy ping-pong that is what a
// hop costs above the kernel's TCP, apart from the spin's detection delay.
// Callgrind counts every instruction of a call, this counts the ones on
// the path: the library's work after its send system call (the -w mode
// counts it) runs while the peer answers.
//
//   cc -O2 -Wall -Wextra -Werror -o /tmp/cp scripts/critical-path.c
//   /tmp/cp [-n SAMPLES] [-s SKIP] [-w] [-v] [-P] [-d FILE] [-e NAME=VALUE]... -- PROGRAM ARGS...
//
//   -n N   samples kept per task (default 500); then the task runs traced
//          for fork, exec and exit only
//   -s N   warm-up samples discarded per task first (default 50)
//   -w     post-send mode: from each write-class call's return to the next
//          system call (tallied by the call that ends it)
//   -e N=V an environment variable for the traced program only (LD_PRELOAD
//          must not apply to this tracer)
//   -d F   writes sample number 100 (after the warm-up) of the first task
//          that records it to F, one line per counted instruction, in order:
//          "OBJECT-PATH FILE-OFFSET" (hex; "?" for an address in no named
//          mapping; scripts/lib/critical_path.py turns it into source files);
//          -n must be above 100
//   -v     per-object breakdown, the calls that opened and closed intervals
//
// Output: per task a summary line, and a line for scripts: "task pid= tgid=
// comm= samples= given_up= opened=NR:COUNT,... returned=VALUE:COUNT,...
// closed=NR:COUNT,..." (the calls that opened and closed its samples, and
// what the openers returned); then medians over every task's samples.
//   -P     no parking (below)
//
// System calls are told by number at the kernel's entry stop, whatever
// issues them (libc, or the preload's own `syscall` instructions). Stepping
// ends where RIP points at a syscall, sysenter or int 0x80 instruction (not
// counted). A trap that leaves RIP unchanged (another iteration of a rep
// string instruction) is not a new instruction. Each instruction is
// attributed to the executable mapping holding it (/proc/PID/maps): the
// program's own image, or another object (libraries, vDSO, ld.so).
// Parking: while a task is stepped, a task whose read returns EAGAIN (a
// busy poller) is held at that return, else it would spin through two
// ptrace stops per poll; it is let go when no task is stepped, or when an
// interval passes 20000 steps (a stepped task that waits on it in user
// space cannot deadlock). It changes how often the peer polls, and it can
// change which hops become samples: a hop whose path meets a system call
// before its send (a lock held by a parked thread of the library: a futex
// wait) is no sample, so the medians are those of the hops that went
// straight, which in a busy ping-pong is nearly all (-v prints the
// intervals discarded, by the call that ended them). An interval that
// meets no system call within 10^7 steps is given up.
// Exit status: the traced program's (128 + signal if killed).
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

enum { S_SYS, S_STEP, S_WAITENTRY, S_DONE };

#define MAXOBJ 64
// An executable mapping; `name` indexes the task's names[].
struct obj { uint64_t lo, hi, pgoff; int is_exe, name; };
struct oname { char name[96], path[512]; int is_exe; long insns; };
// -d: the instructions of sample number DUMP_SAMPLE (after the warm-up) of
// the first task that records it, kept while its interval runs and written
// only if the interval becomes that sample (a discarded one is dropped).
#define DUMP_SAMPLE 100
static FILE *dumpf;
static pid_t dump_pid;
static char *dump_buf; static size_t dump_len, dump_cap;
// An interval that reaches no system call within this many steps is given
// up (tallied, not a sample): a program that computes for ever between a
// read and its answer is not a ping-pong.
#define STEP_LIMIT 10000000L

#define MAXTALLY 32
struct tally { long nr; long count; };

struct task {
  pid_t pid, tgid;            // tgid and comm read with the maps (at each exec)
  char comm[32];
  int alive, seen_first_stop;
  int state;
  int parked;                 // held at an EAGAIN read exit while another task is being stepped
  int resume;                 // ptrace request used to resume in current state
  // current stepping interval
  long steps, insns, exe_insns;
  long opener, opener_rval;   // the read that opened it, and what it returned
  uint64_t prev_rip;
  long cur_obj_insns[MAXOBJ], unattributed;
  int reloaded_this_interval;
  // maps (reloaded when a stepped RIP falls outside every known executable mapping)
  int maps_loaded, nobj, nnames;
  struct obj objs[MAXOBJ];
  struct oname names[MAXOBJ];
  // samples
  long skipped, n, cap;
  long *cnt, *exe, *raw;
  struct tally discarded[MAXTALLY]; int ndiscarded;  // intervals ended by another call, by its number
  long stray_traps, sigs_passed, intervals, stops_sys, stops_step, given_up;
  struct tally opened[MAXTALLY]; int nopened;        // every interval, by the call that opened it
  struct tally returned[MAXTALLY]; int nreturned;    // ... and by what that call returned
  struct tally closed[MAXTALLY]; int nclosed;        // samples, by the call that closed them
  struct tally sample_opened[MAXTALLY]; int nsample_opened;      // samples, by their opener
  struct tally sample_returned[MAXTALLY]; int nsample_returned;  // ... and its return value
};

static struct task *tasks; static int ntasks, captasks;
static long maxsamples = 500, skip = 50;
static int wmode, verbose, noparking;
static long park_limit = 20000, parked_total;
static void unpark_all(void);
static int park_suspended;    // set when an interval grows past park_limit: stop parking until no interval is open

static int is_read(long nr) { return nr == SYS_read || nr == SYS_readv || nr == SYS_recvfrom || nr == SYS_recvmsg; }
static int is_write(long nr) { return nr == SYS_write || nr == SYS_writev || nr == SYS_sendto || nr == SYS_sendmsg; }

static struct task *find(pid_t pid, int create) {
  for (int i = 0; i < ntasks; i++) if (tasks[i].pid == pid && tasks[i].alive) return &tasks[i];
  if (!create) return NULL;
  if (ntasks == captasks) {
    captasks = captasks ? captasks * 2 : 16;
    tasks = realloc(tasks, captasks * sizeof *tasks);
    if (!tasks) { perror("realloc"); exit(1); }
  }
  struct task *t = &tasks[ntasks++];
  memset(t, 0, sizeof *t);
  t->pid = pid; t->alive = 1; t->state = S_SYS; t->resume = PTRACE_SYSCALL;
  return t;
}

static void tally_add(struct tally *a, int *n, long nr) {
  for (int i = 0; i < *n; i++) if (a[i].nr == nr) { a[i].count++; return; }
  if (*n < MAXTALLY) { a[*n].nr = nr; a[*n].count = 1; (*n)++; }
}

static void load_maps(struct task *t) {
  char path[64], exe[PATH_MAX], line[PATH_MAX + 128];
  t->maps_loaded = 1; t->nobj = 0;
  snprintf(path, sizeof path, "/proc/%d/status", t->pid);
  FILE *status = fopen(path, "r");
  if (status) {
    while (fgets(line, sizeof line, status)) {
      (void)sscanf(line, "Name: %31s", t->comm);
      (void)sscanf(line, "Tgid: %d", &t->tgid);
    }
    fclose(status);
  }
  snprintf(path, sizeof path, "/proc/%d/exe", t->pid);
  ssize_t el = readlink(path, exe, sizeof exe - 1);
  if (el < 0) el = 0;
  exe[el] = 0;
  snprintf(path, sizeof path, "/proc/%d/maps", t->pid);
  FILE *f = fopen(path, "r");
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi, pg = 0; char perms[8]; int off = 0;
    if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %n", &lo, &hi, perms, &pg, &off) < 4) continue;
    if (perms[2] != 'x') continue;
    char *name = off ? line + off : (char *)"";
    name[strcspn(name, "\n")] = 0;
    if (t->nobj == MAXOBJ) break;
    struct obj *o = &t->objs[t->nobj++];
    o->lo = lo; o->hi = hi; o->pgoff = pg; o->is_exe = el > 0 && !strcmp(name, exe);
    const char *base = strrchr(name, '/');
    char shortname[96];
    snprintf(shortname, sizeof shortname, "%s", base ? base + 1 : (*name ? name : "[anon]"));
    int k;
    for (k = 0; k < t->nnames; k++) if (!strcmp(t->names[k].name, shortname)) break;
    if (k == t->nnames) {
      if (t->nnames == MAXOBJ) { t->nobj--; continue; }
      snprintf(t->names[k].name, sizeof t->names[k].name, "%s", shortname);
      snprintf(t->names[k].path, sizeof t->names[k].path, "%s", name);
      t->names[k].is_exe = o->is_exe; t->names[k].insns = 0; t->nnames++;
    }
    o->name = k;
  }
  fclose(f);
}

static int obj_of(struct task *t, uint64_t rip) {
  for (int i = 0; i < t->nobj; i++) if (rip >= t->objs[i].lo && rip < t->objs[i].hi) return i;
  return -1;
}

// Cache of "is the instruction at this address a syscall instruction".  One
// global cache for all tasks: forked children and threads share the same
// (unmodified) text; the cache is cleared on every exec.
#define CACHE_BITS 16
static struct { uint64_t rip; signed char v; } scache[1 << CACHE_BITS];
static void scache_clear(void) { memset(scache, 0, sizeof scache); }

// 1 if the instruction at rip is a system call instruction (syscall, sysenter, int 0x80).
// Reads aligned words so a read never crosses into an unmapped page.
static int at_syscall_insn(pid_t pid, uint64_t rip) {
  uint64_t a = rip & ~7ULL; unsigned char b[16];
  errno = 0;
  long w0 = ptrace(PTRACE_PEEKTEXT, pid, (void *)a, 0);
  if (errno) return 0;
  memcpy(b, &w0, 8);
  int o = rip - a;
  if (o == 7) {
    errno = 0;
    long w1 = ptrace(PTRACE_PEEKTEXT, pid, (void *)(a + 8), 0);
    if (errno) return 0;
    memcpy(b + 8, &w1, 8);
  }
  unsigned char c0 = b[o], c1 = b[o + 1];
  return (c0 == 0x0f && (c1 == 0x05 || c1 == 0x34)) || (c0 == 0xcd && c1 == 0x80);
}

// The dump of the interval now running, if it may become sample DUMP_SAMPLE.
static int dumping(const struct task *t) {
  return dumpf && t->skipped >= skip && t->n == DUMP_SAMPLE && (!dump_pid || dump_pid == t->pid);
}

static void dump_line(const char *path, unsigned long off) {
  char line[600];
  int k = snprintf(line, sizeof line, "%s %lx\n", path, off);
  if (k < 0 || (size_t)k >= sizeof line) return;
  if (dump_len + (size_t)k > dump_cap) {
    dump_cap = dump_cap ? dump_cap * 2 : 1 << 16;
    if (!(dump_buf = realloc(dump_buf, dump_cap))) { perror("realloc"); exit(1); }
  }
  memcpy(dump_buf + dump_len, line, (size_t)k);
  dump_len += (size_t)k;
}

// The interval just ended at a write-class call (any call with -w): a
// sample, unless still in the warm-up.
static void record(struct task *t) {
  t->intervals++;
  if (t->skipped < skip) { t->skipped++; return; }
  if (dumping(t)) {
    dump_pid = t->pid;
    fwrite(dump_buf, 1, dump_len, dumpf);
    fclose(dumpf);
    dumpf = NULL;
  }
  tally_add(t->sample_opened, &t->nsample_opened, t->opener);
  tally_add(t->sample_returned, &t->nsample_returned, t->opener_rval);
  if (t->n == t->cap) {
    t->cap = t->cap ? t->cap * 2 : 256;
    t->cnt = realloc(t->cnt, t->cap * sizeof(long));
    t->exe = realloc(t->exe, t->cap * sizeof(long));
    t->raw = realloc(t->raw, t->cap * sizeof(long));
    if (!t->cnt || !t->exe || !t->raw) { perror("realloc"); exit(1); }
  }
  t->cnt[t->n] = t->insns; t->exe[t->n] = t->exe_insns; t->raw[t->n] = t->steps; t->n++;
  for (int i = 0; i < t->nnames; i++) t->names[i].insns += t->cur_obj_insns[i];
}

// Whether the instruction at rip is a system call instruction, remembered
// by address: every traced process here runs the same program and
// libraries from the same addresses (forked, not re-executed; the cache is
// cleared at every exec). A program that maps other code at an address
// another process used would need the cache keyed by process as well.
static int is_syscall_cached(pid_t pid, uint64_t rip) {
  unsigned h = (unsigned)((rip * 0x9E3779B97F4A7C15ULL) >> (64 - CACHE_BITS));
  if (scache[h].rip == rip && scache[h].v) return scache[h].v > 0;
  int v = at_syscall_insn(pid, rip);
  scache[h].rip = rip; scache[h].v = v ? 1 : -1;
  return v;
}

// The request that goes on from rip: a single step, or, at a system call
// instruction, running up to that call's entry stop (which ends the interval).
static int step_or_stop(struct task *t, uint64_t rip) {
  if (is_syscall_cached(t->pid, rip)) { t->state = S_WAITENTRY; return PTRACE_SYSCALL; }
  t->state = S_STEP; return PTRACE_SINGLESTEP;
}

static void start_interval(struct task *t, long opener, long rval) {
  struct user_regs_struct r;
  if (!t->maps_loaded) load_maps(t);
  t->opener = opener; t->opener_rval = rval;
  if (dumping(t)) dump_len = 0;
  t->steps = t->insns = t->exe_insns = 0; t->reloaded_this_interval = 0;
  memset(t->cur_obj_insns, 0, sizeof t->cur_obj_insns);
  if (ptrace(PTRACE_GETREGS, t->pid, 0, &r) < 0) { t->resume = PTRACE_SYSCALL; return; }
  t->prev_rip = r.rip;
  t->resume = step_or_stop(t, r.rip);
}

static void on_step(struct task *t) {
  struct user_regs_struct r;
  if (ptrace(PTRACE_GETREGS, t->pid, 0, &r) < 0) { t->state = S_SYS; t->resume = PTRACE_SYSCALL; return; }
  t->steps++;
  // A trap that leaves RIP unchanged is another iteration of a rep-prefixed
  // string instruction (or a trap with no instruction executed): not a new instruction.
  if (r.rip != t->prev_rip) {
    t->insns++;
    int o = obj_of(t, t->prev_rip);
    if (o < 0 && !t->reloaded_this_interval) { t->reloaded_this_interval = 1; load_maps(t); o = obj_of(t, t->prev_rip); }
    if (dumping(t)) {
      const char *path = o >= 0 ? t->names[t->objs[o].name].path : "";
      dump_line(*path ? path : "?", o >= 0 ? (unsigned long)(t->prev_rip - t->objs[o].lo + t->objs[o].pgoff)
                                           : (unsigned long)t->prev_rip);
    }
    if (o >= 0) { t->cur_obj_insns[t->objs[o].name]++; if (t->objs[o].is_exe) t->exe_insns++; }
    else t->unattributed++;
  }
  t->prev_rip = r.rip;
  if (t->steps > STEP_LIMIT) {
    // Given up: no system call in sight; the task runs on traced at calls only.
    t->given_up++; t->state = S_SYS; t->resume = PTRACE_SYSCALL;
    return;
  }
  t->resume = step_or_stop(t, r.rip);
  if (t->steps > park_limit && !park_suspended) { park_suspended = 1; unpark_all(); }
}

static int cmpl(const void *a, const void *b) { long x = *(const long *)a, y = *(const long *)b; return x < y ? -1 : x > y; }
static long median(const long *v, long n) {
  if (!n) return 0;
  long *c = malloc(n * sizeof(long)); memcpy(c, v, n * sizeof(long));
  qsort(c, n, sizeof(long), cmpl);
  long m = c[(n - 1) / 2]; free(c); return m;
}

static int any_interval(void) {
  for (int i = 0; i < ntasks; i++)
    if (tasks[i].alive && (tasks[i].state == S_STEP || tasks[i].state == S_WAITENTRY)) return 1;
  return 0;
}
static void unpark_all(void) {
  for (int i = 0; i < ntasks; i++)
    if (tasks[i].alive && tasks[i].parked) { tasks[i].parked = 0; ptrace(tasks[i].resume, tasks[i].pid, 0, 0); }
}
// after any stop that may have closed an interval
static void maybe_unpark(void) {
  if (!any_interval()) { park_suspended = 0; unpark_all(); }
}

static void usage(void) {
  fprintf(stderr, "usage: critical-path [-n SAMPLES] [-s SKIP] [-w] [-v] [-P] [-d FILE] [-e NAME=VALUE]... -- PROGRAM ARGS...\n");
  exit(2);
}

int main(int argc, char **argv) {
  char **envs = calloc(argc, sizeof(char *)); int nenv = 0;
  int i = 1;
  for (; i < argc; i++) {
    if (!strcmp(argv[i], "--")) { i++; break; }
    if (!strcmp(argv[i], "-n") && i + 1 < argc) maxsamples = atol(argv[++i]);
    else if (!strcmp(argv[i], "-s") && i + 1 < argc) skip = atol(argv[++i]);
    else if (!strcmp(argv[i], "-e") && i + 1 < argc) envs[nenv++] = argv[++i];
    else if (!strcmp(argv[i], "-d") && i + 1 < argc) {
      if (!(dumpf = fopen(argv[++i], "w"))) { perror(argv[i]); return 2; }
    }
    else if (!strcmp(argv[i], "-w")) wmode = 1;
    else if (!strcmp(argv[i], "-v")) verbose = 1;
    else if (!strcmp(argv[i], "-P")) noparking = 1;
    else if (argv[i][0] != '-') break;
    else usage();
  }
  if (i >= argc || maxsamples <= 0 || skip < 0) usage();
  if (dumpf && maxsamples <= DUMP_SAMPLE) {
    fprintf(stderr, "critical-path: -d writes sample %d: -n must be above it\n", DUMP_SAMPLE);
    return 2;
  }
  char **prog = argv + i;

  pid_t child = fork();
  if (child < 0) { perror("fork"); return 1; }
  if (child == 0) {
    for (int k = 0; k < nenv; k++) {
      char *eq = strchr(envs[k], '=');
      if (!eq) { fprintf(stderr, "critical-path: -e needs NAME=VALUE\n"); _exit(127); }
      *eq = 0; setenv(envs[k], eq + 1, 1);
    }
    if (ptrace(PTRACE_TRACEME, 0, 0, 0) < 0) { perror("PTRACE_TRACEME"); _exit(127); }
    raise(SIGSTOP);
    execvp(prog[0], prog);
    perror("execvp"); _exit(127);
  }

  const long opts = PTRACE_O_TRACESYSGOOD | PTRACE_O_TRACEFORK | PTRACE_O_TRACECLONE |
                    PTRACE_O_TRACEVFORK | PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL;
  int st, root_status = 0;
  for (;;) {
    pid_t pid = waitpid(-1, &st, __WALL);
    if (pid < 0) { if (errno == EINTR) continue; if (errno == ECHILD) break; perror("waitpid"); break; }
    struct task *t = find(pid, 1);
    if (WIFEXITED(st) || WIFSIGNALED(st)) {
      if (verbose || pid == child)
        fprintf(stderr, "critical-path: pid %d %s %d\n", pid, WIFEXITED(st) ? "exited" : "killed by signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      if (pid == child) root_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      t->alive = 0; t->parked = 0;
      maybe_unpark();
      continue;
    }
    if (!WIFSTOPPED(st)) continue;
    int sig = WSTOPSIG(st), event = st >> 16;

    if (!t->seen_first_stop) {
      t->seen_first_stop = 1;
      if (sig == SIGSTOP && !event) {       // initial stop of a new (or the root) tracee: swallow
        if (pid == child && ptrace(PTRACE_SETOPTIONS, pid, 0, opts) < 0) { perror("PTRACE_SETOPTIONS"); return 1; }
        ptrace(PTRACE_SYSCALL, pid, 0, 0);
        continue;
      }
    }
    if (event) {
      // fork, vfork, clone and exec event stops: resume as before
      if (event == PTRACE_EVENT_EXEC) { t->maps_loaded = 0; t->nnames = 0; scache_clear(); }
      ptrace(t->resume, pid, 0, 0);
      continue;
    }
    if (sig == (SIGTRAP | 0x80)) {
      t->stops_sys++;
      struct __ptrace_syscall_info si;
      memset(&si, 0, sizeof si);
      if (ptrace(PTRACE_GET_SYSCALL_INFO, pid, (void *)sizeof si, &si) <= 0) { ptrace(t->resume, pid, 0, 0); continue; }
      if (si.op == PTRACE_SYSCALL_INFO_ENTRY) {
        long nr = (long)si.entry.nr;
        if (t->state == S_WAITENTRY) {
          if (wmode || is_write(nr)) { if (t->skipped >= skip) tally_add(t->closed, &t->nclosed, nr); record(t); }
          else tally_add(t->discarded, &t->ndiscarded, nr);
          if (t->n >= maxsamples) { t->state = S_DONE; t->resume = PTRACE_CONT; }
          else { t->state = S_SYS; t->resume = PTRACE_SYSCALL; }
        }
      } else if (si.op == PTRACE_SYSCALL_INFO_EXIT && t->state == S_SYS) {
        long nr = -1;
        struct user_regs_struct r;
        if (ptrace(PTRACE_GETREGS, pid, 0, &r) == 0) nr = (long)r.orig_rax;
        int opens = wmode ? is_write(nr) : (is_read(nr) && !si.exit.is_error && si.exit.rval > 0);
        if (opens) {
          tally_add(t->opened, &t->nopened, nr);
          tally_add(t->returned, &t->nreturned, (long)si.exit.rval);
          start_interval(t, nr, (long)si.exit.rval);
        }
        else if (!noparking && !park_suspended && is_read(nr) && si.exit.is_error && si.exit.rval == -EAGAIN &&
                 any_interval()) {
          // a busy-polling reader that found nothing while another task is single-stepped:
          // hold it here (it would only spin, costing two stops per poll) until the interval ends
          t->parked = 1; parked_total++;
          continue;
        }
      }
      if (t->state != S_STEP && t->state != S_WAITENTRY) maybe_unpark();
      ptrace(t->resume, pid, 0, 0);
      continue;
    }
    if (sig == SIGTRAP) {
      siginfo_t info; memset(&info, 0, sizeof info);
      ptrace(PTRACE_GETSIGINFO, pid, 0, &info);
      // A kernel-made trap (si_code > 0) is a step's, or stray outside a
      // step (swallowed); one sent by a process (kill) is the program's.
      if (info.si_code > 0) {
        if (t->state == S_STEP) { t->stops_step++; on_step(t); }
        else t->stray_traps++;
        ptrace(t->resume, pid, 0, 0);
        continue;
      }
    }
    // A signal-delivery stop: the signal goes on to the program.
    t->sigs_passed++;
    ptrace(t->resume, pid, 0, (void *)(long)sig);
  }

  // report
  long total = 0;
  for (int k = 0; k < ntasks; k++) total += tasks[k].n;
  long *all = malloc((total + 1) * sizeof(long)), *allexe = malloc((total + 1) * sizeof(long)),
       *alloth = malloc((total + 1) * sizeof(long)), *tmp = malloc((total + 1) * sizeof(long));
  long na = 0;
  printf("critical-path: mode=%s maxsamples=%ld skip=%ld\n", wmode ? "post-send(-w)" : "read-return->send", maxsamples, skip);
  for (int k = 0; k < ntasks; k++) {
    struct task *t = &tasks[k];
    if (!t->n && !t->intervals && !t->ndiscarded) {
      if (verbose) printf("pid %d: no intervals (syscall stops=%ld)\n", t->pid, t->stops_sys);
      continue;
    }
    long mn = LONG_MAX, mx = 0; double sum = 0;
    long reps = 0;
    for (long j = 0; j < t->n; j++) {
      long c = t->cnt[j];
      if (c < mn) mn = c;
      if (c > mx) mx = c;
      sum += c;
      all[na] = c; allexe[na] = t->exe[j]; alloth[na] = c - t->exe[j]; na++;
      tmp[j] = c - t->exe[j];
      reps += t->raw[j] - c;
    }
    if (!t->n) mn = 0;
    printf("pid %d: samples=%ld min=%ld median=%ld mean=%.1f max=%ld | exe_median=%ld other_median=%ld",
           t->pid, t->n, mn, median(t->cnt, t->n), t->n ? sum / t->n : 0.0, mx, median(t->exe, t->n), median(tmp, t->n));
    printf(" | raw_steps_median=%ld (extra traps: %ld total)", median(t->raw, t->n), reps);
    printf(" | warmup_skipped=%ld\n", t->skipped);
    // One line per task for scripts: which process, and what opened and
    // closed its samples (call number:count, return value:count).
    printf("task pid=%d tgid=%d comm=%s samples=%ld given_up=%ld opened=", t->pid, t->tgid, t->comm, t->n, t->given_up);
    for (int d = 0; d < t->nsample_opened; d++) printf("%s%ld:%ld", d ? "," : "", t->sample_opened[d].nr, t->sample_opened[d].count);
    printf(" returned=");
    for (int d = 0; d < t->nsample_returned; d++) printf("%s%ld:%ld", d ? "," : "", t->sample_returned[d].nr, t->sample_returned[d].count);
    printf(" closed=");
    for (int d = 0; d < t->nclosed; d++) printf("%s%ld:%ld", d ? "," : "", t->closed[d].nr, t->closed[d].count);
    printf("\n");
    if (t->ndiscarded) {
      printf("  discarded (next syscall not write-class):");
      for (int d = 0; d < t->ndiscarded; d++) printf(" other:%ld x%ld", t->discarded[d].nr, t->discarded[d].count);
      printf("\n");
    }
    if (wmode && !verbose) {
      printf("  samples closed by syscall:");
      for (int d = 0; d < t->nclosed; d++) printf(" %ld x%ld", t->closed[d].nr, t->closed[d].count);
      printf("\n");
    }
    if (verbose) {
      printf("  intervals opened by syscall:");
      for (int d = 0; d < t->nopened; d++) printf(" %ld x%ld", t->opened[d].nr, t->opened[d].count);
      printf("; samples closed by syscall:");
      for (int d = 0; d < t->nclosed; d++) printf(" %ld x%ld", t->closed[d].nr, t->closed[d].count);
      printf("; stops: syscall=%ld step=%ld\n", t->stops_sys, t->stops_step);
      printf("  return values of opening syscalls:");
      for (int d = 0; d < t->nreturned; d++) printf(" %ld x%ld", t->returned[d].nr, t->returned[d].count);
      printf("\n");
    }
    if (t->stray_traps || t->sigs_passed) printf("  stray_traps=%ld signals_passed=%ld\n", t->stray_traps, t->sigs_passed);
    if (verbose && t->n) {
      printf("  mean insns/sample by object:");
      for (int o = 0; o < t->nnames; o++)
        if (t->names[o].insns) printf(" %s%s=%.1f", t->names[o].name, t->names[o].is_exe ? "(exe)" : "", (double)t->names[o].insns / t->n);
      printf(" (unattributed insns, all intervals: %ld)\n", t->unattributed);
    }
  }
  if (verbose) printf("parked polls: %ld%s\n", parked_total, noparking ? " (parking disabled)" : "");
  printf("exe_median_all=%ld other_median_all=%ld\n", median(allexe, na), median(alloth, na));
  printf("median_all=%ld\n", median(all, na));
  return root_status;   // the traced program's exit status (128+signal if killed)
}
