/* shapegrad C runtime (backends/c/runtime.h): the team size, the adaptive team choice,
   flush-to-zero and team helpers; its text is inlined into every generated unit. */
#include <stdint.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* internal symbols shared by the translation units of one library (direct calls, no PLT) */
#define SG_HIDDEN __attribute__((visibility("hidden")))
/* team size of every parallel loop (sg_set_threads); a clause, not the calling thread's ICV.
   Defined once, in the step unit; every kernel unit reads the same variable (as it does
   sg_adaptive and sg_team_epoch). */
SG_HIDDEN extern int sg_threads;
SG_HIDDEN extern int sg_adaptive;
SG_HIDDEN extern unsigned sg_team_epoch;
/* The adaptive team (sg_set_threads(n, adaptive=1); 0: always the full team; 2: always one
   thread). Each timed function (a step's OpenMP region, or a fork-mode function whose
   statements open their own teams: layer loops, collectives) runs each call with the full
   team or with one thread, whichever is faster now. Its state is one struct sg_team per
   translation unit (one timed function per unit); a step split into kernel units is one
   timed function, its step unit's (SG_FOLLOW_STEP below).

   Probes come in pairs: two consecutive calls, one with each option, in alternating order
   (team first, then one thread first), so both options of a pair see the same load and an
   order effect cancels over pairs. The latest SG_TEAM_HISTORY pairs' times are kept. The
   choice is first the option the median of the latest SG_TEAM_WINDOW pairs' ratios (one-
   thread time / team time) favours by more than SG_TEAM_MARGIN (else it stays). A median:
   a call that stalled (a descheduled thread at a barrier, a page fault) is one outlier,
   never a decision. But under sustained load the team's calls are bimodal (fast while both
   cores are ours, slow while the other thread waits for one), and then the median pair can
   favour one thread while the mean, the throughput, favours the team. So from
   SG_TEAM_MEANS_MIN pairs on, the means decide where they can (sg_team_means): when the
   mean difference of the history's pairs is SG_TEAM_Z standard errors from 0, its option
   is held until the latest window's pairs say the opposite by the same test (the load
   changed), and the median decides only while no such option is held. The means count only
   the pairs that ran the other option first: there both calls pay a switch (the other
   core's caches, a waking thread), while in a pair that starts with the choice only the
   other option does, which would hold the choice against an option up to a switch's cost
   faster.
   The first SG_TEAM_WINDOW pairs run back to back (fewer when the first pairs are clear:
   sg_team_clear); after that a pair comes every
   sg_team_period() calls, longer the more the options differ (or the latest probe cost),
   so probing the slower option costs about 1.5% of the time whatever the gap. A pair that disagrees with the choice
   (the other option faster by more than the margin) is followed by another at once: a
   change of load is confirmed, or refuted, within a few calls instead of a few periods.
   Blocks and partial sums are cut by sg_threads, not by the team a call ran with, so
   results do not depend on the choice.
   benchmarks/team_replay.py replays calls recorded on a real machine through this rule. */
#define SG_TEAM_WINDOW 15
#define SG_TEAM_MARGIN 0.03
#define SG_TEAM_HISTORY 63
#define SG_TEAM_MEANS_MIN 31u
#define SG_TEAM_Z 1.5
struct sg_team {
    unsigned epoch;                 /* 1 + sg_team_epoch at the last reset (0: never) */
    unsigned pairs;                 /* pairs measured since the reset */
    unsigned wait;                  /* calls left before the next pair */
    int choice;                     /* the calls between pairs: 1 full team, 0 one thread */
    int by_means;                   /* the option the means chose and hold, or -1 */
    int probe;                      /* 0 no pair running; 1, 2: this call is its first, second */
    int order;                      /* the option the next pair runs first */
    double first;                   /* seconds of the pair's first call */
    double solo[SG_TEAM_HISTORY];   /* seconds of the one-thread call of the latest pairs */
    double team[SG_TEAM_HISTORY];   /* and of their full-team call */
    unsigned char fair[SG_TEAM_HISTORY]; /* the pair ran the other option first */
};
/* calls counted by sg_team_record (sg_team_counts): all timed calls, and those on one
   thread; defined in the step unit */
SG_HIDDEN extern unsigned long long sg_team_calls, sg_team_solo;
static inline void sg_team_reset(struct sg_team *s, unsigned epoch) {
    s->epoch = epoch + 1u;
    s->pairs = s->wait = 0;
    s->choice = s->order = 1;
    s->by_means = -1;
    s->probe = 0;
    s->first = 0.0;
}
/* the pairs among the latest ``last`` (fewer while there are fewer) */
static inline unsigned sg_team_latest(const struct sg_team *s, unsigned last) {
    return s->pairs < last ? s->pairs : last;
}
/* slot of the k-th latest pair (k = 0: the latest) */
static inline unsigned sg_team_slot(const struct sg_team *s, unsigned k) {
    return (s->pairs - 1u - k) % SG_TEAM_HISTORY;
}
/* one-thread / team seconds of the k-th latest pair */
static inline double sg_team_ratio(const struct sg_team *s, unsigned k) {
    unsigned i = sg_team_slot(s, k);
    return s->solo[i] / s->team[i];
}
/* the median of the window's ratios (of the pairs so far while it is not full) */
static inline double sg_team_median(const struct sg_team *s) {
    unsigned n = sg_team_latest(s, SG_TEAM_WINDOW);
    double v[SG_TEAM_WINDOW];
    for (unsigned i = 0; i < n; ++i) { /* insertion sort of a few values */
        double x = sg_team_ratio(s, i);
        unsigned j = i;
        for (; j > 0 && v[j - 1] > x; j -= 1) v[j] = v[j - 1];
        v[j] = x;
    }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
/* calls between pairs: 8 + 64 * (gap - 1), at most SG_TEAM_MAX_PERIOD, where gap >= 1 is
   how many times slower the other option is, so (gap - 1) / period stays about 1.5%. The
   gap is the larger of the window's median and the mean of what its probes cost: under
   heavy load a full-team call can take 50 times a one-thread call (each barrier waits for
   a descheduled thread) while its median is a few times, and probing it at the median's
   period cost 40% of the time (tests/test_c_adaptive_team.py). The cap bounds how long a
   change of load can go unseen: 1024 calls. */
#define SG_TEAM_MAX_PERIOD 1024.0
static inline unsigned sg_team_period(double gap) {
    double calls = 8.0 + 64.0 * ((gap > 1.0 ? gap : 1.0) - 1.0);
    return calls < SG_TEAM_MAX_PERIOD ? (unsigned)calls : (unsigned)SG_TEAM_MAX_PERIOD;
}
/* The first pairs are clear when there are SG_TEAM_CLEAR_PAIRS of them and every one
   favours the same option by more than SG_TEAM_CLEAR_GAP: the window then fills at the
   probe period instead of back to back. At a 2x gap the back-to-back window ran 15 calls of
   the slow option first (the CNN step: 40 timed steps after a cold start averaged 1.5x the
   settled step); now it runs 4. A gap under SG_TEAM_CLEAR_GAP, or one stalled pair, still
   waits for the whole window. */
#define SG_TEAM_CLEAR_PAIRS 4u
#define SG_TEAM_CLEAR_GAP 1.25
static inline int sg_team_clear(const struct sg_team *s) {
    if (s->pairs < SG_TEAM_CLEAR_PAIRS) return 0;
    int above = 0, below = 0;
    unsigned n = sg_team_latest(s, SG_TEAM_WINDOW);
    for (unsigned i = 0; i < n; ++i) {
        above += sg_team_ratio(s, i) > SG_TEAM_CLEAR_GAP;
        below += sg_team_ratio(s, i) < 1.0 / SG_TEAM_CLEAR_GAP;
    }
    return (unsigned)above == n || (unsigned)below == n;
}
/* The means' verdict on the fair pairs (the other option first) among the latest ``last``:
   1 the team is faster, 0 one thread is, -1 neither by SG_TEAM_Z standard errors of the
   mean difference and by more than SG_TEAM_MARGIN of the pairs' mean time. Paired
   differences: both calls of a pair saw the same load, so its swings cancel. */
static inline int sg_team_means(const struct sg_team *s, unsigned last) {
    unsigned n = 0, latest = sg_team_latest(s, last);
    double sum = 0.0, squares = 0.0, both = 0.0;
    for (unsigned k = 0; k < latest; ++k) {
        unsigned i = sg_team_slot(s, k);
        if (!s->fair[i]) continue;
        double d = s->solo[i] - s->team[i];
        n += 1;
        sum += d;
        squares += d * d;
        both += 0.5 * (s->solo[i] + s->team[i]);
    }
    if (n < 2) return -1;
    double mean = sum / n, var = (squares - n * mean * mean) / (n - 1);
    double error = var > 0.0 ? sqrt(var / n) : 0.0, gap = mean / (both / n);
    if (mean > SG_TEAM_Z * error && gap > SG_TEAM_MARGIN) return 1;
    if (mean < -SG_TEAM_Z * error && gap < -SG_TEAM_MARGIN) return 0;
    return -1;
}
/* 1: run this call with the full team, 0: with one thread */
static inline int sg_team_pick_in(struct sg_team *s, unsigned epoch) {
    if (s->epoch != epoch + 1u) sg_team_reset(s, epoch); /* sg_set_threads ran */
    if (sg_adaptive == 2) return 0; /* one thread, blocks still cut for sg_threads (tests) */
    if (sg_threads <= 1 || !sg_adaptive) return 1;
    if (s->probe == 2) return !s->order;
    if (s->probe == 0 && s->wait > 0) {
        s->wait -= 1;
        return s->choice;
    }
    s->probe = 1; /* a new pair (or the first call of one that was never recorded) */
    return s->order;
}
/* after a call that sg_team_pick_in answered ``pick``: it took ``seconds`` */
static inline void sg_team_record_in(struct sg_team *s, int pick, double seconds) {
    ++sg_team_calls;
    sg_team_solo += !pick;
    if (s->probe == 1) {
        s->first = seconds;
        s->probe = 2;
        return;
    }
    if (s->probe != 2) return;
    s->probe = 0;
    s->order = !s->order;
    if (!(s->first > 0.0 && seconds > 0.0)) return;
    unsigned slot = s->pairs % SG_TEAM_HISTORY;
    s->solo[slot] = pick ? s->first : seconds;
    s->team[slot] = pick ? seconds : s->first;
    s->fair[slot] = pick == s->choice; /* the second call ran the choice */
    ++s->pairs;
    double r = sg_team_ratio(s, 0), m = sg_team_median(s);
    if (m < 1.0 - SG_TEAM_MARGIN) s->choice = 0;
    else if (m > 1.0 + SG_TEAM_MARGIN) s->choice = 1;
    if (s->pairs >= SG_TEAM_MEANS_MIN) {
        int held = sg_team_means(s, SG_TEAM_HISTORY), recent = sg_team_means(s, SG_TEAM_WINDOW);
        if (held >= 0) s->by_means = held;
        if (recent >= 0 && recent != s->by_means) s->by_means = -1;
        if (s->by_means >= 0) s->choice = s->by_means;
    }
    int disagrees = s->choice ? r < 1.0 - SG_TEAM_MARGIN : r > 1.0 + SG_TEAM_MARGIN;
    double gap = m >= 1.0 ? m : 1.0 / m, cost = 0.0; /* cost: mean of the window's probes */
    unsigned n = sg_team_latest(s, SG_TEAM_WINDOW);
    for (unsigned i = 0; i < n; ++i) /* the other option's time / the choice's */
        cost += (s->choice ? sg_team_ratio(s, i) : 1.0 / sg_team_ratio(s, i)) / n;
    if (cost > gap) gap = cost;
    int filling = s->pairs < SG_TEAM_WINDOW && !sg_team_clear(s);
    s->wait = filling || disagrees ? 0u : sg_team_period(gap) - 2u;
}
static struct sg_team sg_team_state __attribute__((unused)); /* this unit's timed function */
/* fork mode: the team of this call's parallel statements (sg_threads or 1), set by the
   timed function before its statements and the layer bodies they call run */
static int sg_team_now __attribute__((unused)) = 1;
/* A step split into kernel units makes one decision per call: its step unit picks and times
   the whole call, and each kernel unit (rendered with SG_FOLLOW_STEP) runs the team the
   step picked. Units that decided alone could disagree, and then every call of each pays
   a switch (the CNN step under two busy processes: 1.050 of its full team as two units,
   1.025 as one, in one threads_ab.py run). Defined in the step unit. */
SG_HIDDEN extern int sg_step_pick;
#ifdef SG_FOLLOW_STEP
static inline int sg_team_pick(void) { return sg_step_pick; }
static inline void sg_team_record(int pick, double seconds) { (void)pick; (void)seconds; }
#else
static inline int sg_team_pick(void) { return sg_team_pick_in(&sg_team_state, sg_team_epoch); }
static inline void sg_team_record(int pick, double seconds) {
    sg_team_record_in(&sg_team_state, pick, seconds);
}
#endif
#include <time.h>
static inline double sg_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static inline int sg_thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
/* Flush-to-zero (render_c(flush_denormals=True) defines SG_FLUSH_DENORMALS): the entry
   points record the calling thread's mode in sg_fp_caller and set FTZ|DAZ; every thread of
   a team sets them for its region and leaves with the caller's mode. Not its own previous
   mode: a pool thread born inside a flushed call inherits FTZ|DAZ from its creator, and
   restoring that would leave it flushing in every later call of any program. */
SG_HIDDEN extern unsigned long long sg_fp_caller;
#if defined(SG_FLUSH_DENORMALS) && (defined(__x86_64__) || defined(__i386__))
#include <xmmintrin.h>
#define SG_FP_CALL_ENTER unsigned int sg_fp_saved = _mm_getcsr(); \
    sg_fp_caller = sg_fp_saved; _mm_setcsr(sg_fp_saved | 0x8040u)
#define SG_FP_CALL_LEAVE _mm_setcsr(sg_fp_saved)
#define SG_FP_ENTER _mm_setcsr((unsigned int)sg_fp_caller | 0x8040u)
#define SG_FP_LEAVE _mm_setcsr((unsigned int)sg_fp_caller)
#elif defined(SG_FLUSH_DENORMALS) && defined(__aarch64__)
#define SG_FP_CALL_ENTER uint64_t sg_fp_saved; __asm__ __volatile__("mrs %0, fpcr" : "=r"(sg_fp_saved)); \
    sg_fp_caller = sg_fp_saved; __asm__ __volatile__("msr fpcr, %0" : : "r"(sg_fp_saved | (1ull << 24)))
#define SG_FP_CALL_LEAVE __asm__ __volatile__("msr fpcr, %0" : : "r"(sg_fp_saved))
#define SG_FP_ENTER __asm__ __volatile__("msr fpcr, %0" : : "r"((uint64_t)sg_fp_caller | (1ull << 24)))
#define SG_FP_LEAVE __asm__ __volatile__("msr fpcr, %0" : : "r"((uint64_t)sg_fp_caller))
#else
#define SG_FP_CALL_ENTER (void)0
#define SG_FP_CALL_LEAVE (void)0
#define SG_FP_ENTER (void)0
#define SG_FP_LEAVE (void)0
#endif
static inline int sg_team_size(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* One row of an outer product, c[j] = a * b[j * stride] (a product with k = 1: the
   per-example gradients of sg.vmap(sg.grad(...))), with streaming stores where the ISA has
   them. A large outer product is written once and not read back soon: bypassing the cache
   saves reading each line before it is overwritten (teamsplit.py's outer_product, which
   measures it). One rounding per element, as the library product it replaces. */
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif
static inline void sg_outer_row_f32(float *c, float a, const float *b, int64_t stride, int64_t n) {
    int64_t j = 0;
#if defined(__AVX512F__)
    if (stride == 1) {
        for (; j < n && ((uintptr_t)(c + j) & 63); ++j) c[j] = a * b[j];
        const __m512 s = _mm512_set1_ps(a);
        for (; j + 16 <= n; j += 16) _mm512_stream_ps(c + j, _mm512_mul_ps(s, _mm512_loadu_ps(b + j)));
    }
#elif defined(__AVX__)
    if (stride == 1) {
        for (; j < n && ((uintptr_t)(c + j) & 31); ++j) c[j] = a * b[j];
        const __m256 s = _mm256_set1_ps(a);
        for (; j + 8 <= n; j += 8) _mm256_stream_ps(c + j, _mm256_mul_ps(s, _mm256_loadu_ps(b + j)));
    }
#endif
    for (; j < n; ++j) c[j] = a * b[j * stride];
}
static inline void sg_outer_row_f64(double *c, double a, const double *b, int64_t stride, int64_t n) {
    int64_t j = 0;
#if defined(__AVX512F__)
    if (stride == 1) {
        for (; j < n && ((uintptr_t)(c + j) & 63); ++j) c[j] = a * b[j];
        const __m512d s = _mm512_set1_pd(a);
        for (; j + 8 <= n; j += 8) _mm512_stream_pd(c + j, _mm512_mul_pd(s, _mm512_loadu_pd(b + j)));
    }
#elif defined(__AVX__)
    if (stride == 1) {
        for (; j < n && ((uintptr_t)(c + j) & 31); ++j) c[j] = a * b[j];
        const __m256d s = _mm256_set1_pd(a);
        for (; j + 4 <= n; j += 4) _mm256_stream_pd(c + j, _mm256_mul_pd(s, _mm256_loadu_pd(b + j)));
    }
#endif
    for (; j < n; ++j) c[j] = a * b[j * stride];
}
/* Streaming stores are weakly ordered: each writing thread fences before others read. */
static inline void sg_stream_fence(void) {
#if defined(__AVX512F__) || defined(__AVX__)
    _mm_sfence();
#endif
}
