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
/* The step's region runs with the full team or with one thread, whichever is faster
   (sg_set_threads(n, adaptive=1); 0: always the full team). Two calls in every SG_PROBE
   (every SG_PROBE / 4 during the first 16 * SG_PROBE calls) run one with each choice, back to back and in alternating order, so both see the same
   load; sg_ratio is a moving average of their time ratio (one thread / full team, each
   pair clamped to [1/2, 2] so one stalled call cannot decide). The other calls use one
   thread only while sg_ratio < 0.95. Under contention the team usually stays faster (the
   OS gives each thread its share), but where barriers stall more than the second thread
   gains, steps fall back to one thread. Blocks and partial sums are cut by sg_threads,
   not by the team a call ran with, so results do not depend on the choice. */
#define SG_PROBE 64
static double sg_ratio = 1.0;
static double sg_probe_first;
static unsigned sg_calls;
#include <time.h>
static inline double sg_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static unsigned sg_seen_epoch;
static inline int sg_team_pick(void) {
    if (sg_seen_epoch != sg_team_epoch) { /* sg_set_threads ran: this unit starts afresh */
        sg_seen_epoch = sg_team_epoch;
        sg_ratio = 1.0;
        sg_calls = 0;
    }
    if (sg_adaptive == 2) return 0; /* one thread, blocks still cut for sg_threads (tests) */
    if (sg_threads <= 1 || !sg_adaptive) return 1;
    unsigned period = sg_calls < 16u * SG_PROBE ? SG_PROBE / 4 : SG_PROBE; /* faster at first */
    unsigned c = sg_calls % period, order = (sg_calls / period) & 1u;
    ++sg_calls;
    if (c < 2) return (int)(c ^ order); /* a probe pair */
    return sg_ratio >= 0.95;
}
static inline void sg_team_record(int pick, double seconds) {
    unsigned call = sg_calls - 1;
    unsigned c = call % (call < 16u * SG_PROBE ? SG_PROBE / 4 : SG_PROBE);
    if (c == 0) {
        sg_probe_first = seconds;
    } else if (c == 1 && sg_probe_first > 0.0 && seconds > 0.0) {
        double r = pick ? sg_probe_first / seconds : seconds / sg_probe_first;
        r = r < 0.5 ? 0.5 : (r > 2.0 ? 2.0 : r);
        sg_ratio += 0.25 * (r - sg_ratio);
    }
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
