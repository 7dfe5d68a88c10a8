/* gcc 12.2 wrong code, found through shapegrad's C backend (issue 26). Kept as a test input
   (tests/test_c_gcc_workarounds.py compiles it with DEFAULT_CFLAGS and checks the answer).

   What it is: the C backend's code for sg.jvp(lambda z: sg.cross_entropy(z, y, axis=1)) on a
   [2, 4, 3, 2] float64 input, reduced kernel by kernel and statement by statement (every cut
   a whole statement, so the program stays defined C) to the part that still miscompiles.
   main() prints t27[8] and t27[9] of the arena (kernel k6's reduction); the right answer,
   from any -O0 build and from NumPy, is
       -1.1919463586369721 0.19635577993896336
   Defined behaviour: the same answer under -O0/-O2 with -fsanitize=address,undefined (no
   report); every arena access goes through pointers based on `arena`; no slot is read before
   it is written except zero-initialised static storage.

   gcc (Debian 12.2.0-14+deb12u1) 12.2.0 on x86-64 (the AMD EPYC dev box, AVX-512), flags
       -O2 -ftree-vectorize -fpeel-loops -march=native -fopenmp -fno-math-errno
       -fno-trapping-math -fno-signed-zeros -fassociative-math -fno-semantic-interposition
       -fvect-cost-model=dynamic
   print t27[9] = -1.5632475057869157 (so does -march=x86-64-v3 or -march=x86-64-v4 in place
   of -march=native: AVX2 is enough). Any one of -fno-associative-math, -fno-tree-fre,
   -fno-tree-dse, -fno-tree-slp-vectorize, -fno-tree-loop-vectorize, -fno-peel-loops,
   -fno-tree-pta, dropping `restrict` from sg_body's `arena` parameter, or dropping the
   `declare simd` on exp gives the right answer (-fno-tree-pre does not).

   Mechanism (from the assembly): FRE forwards k1's two vector exp results (calls to the
   libmvec variant _ZGVdN4v_exp, 4 lanes each) through the arena into k6, whose
   fully unrolled 2 x 4 sum of products becomes a basic-block SLP reduction. Reassociation
   (-fassociative-math) lets the SLP pass pick a lane order [3, 2, 0, 1] for the reduction:
   the in1 loads and the first exp vector get that permutation (vpermpd $75), the second exp
   vector is used unpermuted, so row 9 sums in1[r'] * t8[r] with mismatched lanes. */
/* shapegrad generated: program <lambda> */
/* shapegrad C runtime (backends/c/runtime.h): the team size, the adaptive team choice,
   flush-to-zero and team helpers; its text is inlined into every generated unit. */
#include <stdint.h>
#include <stdio.h>
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

static inline float sg_maxf(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float sg_minf(float a, float b) { return (a < b || a != a) ? a : b; }
static inline double sg_maxd(double a, double b) { return (a > b || a != a) ? a : b; }
static inline double sg_mind(double a, double b) { return (a < b || a != a) ? a : b; }
static inline int32_t sg_maxi(int32_t a, int32_t b) { return a > b ? a : b; }
static inline int32_t sg_mini(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int32_t sg_idiv(int32_t a, int32_t b) {
    /* NumPy reference: x / 0 -> x; INT_MIN / -1 wraps (never UB). */
    if (b == 0) return a;
    if (b == -1) return (int32_t)(0u - (uint32_t)a);
    return a / b;
}
static inline int32_t sg_ipow(int32_t a, int32_t b) {
    uint32_t r = 1u, base = (uint32_t)a;
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    while (b) { if (b & 1) r *= base; base *= base; b >>= 1; }
    return (int32_t)r;
}
static inline float sg_bf2f(uint16_t h) {
    union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}
static inline uint16_t sg_f2bf(float f) {
    /* to nearest, ties to even; NaN stays NaN (quiet), as ml_dtypes rounds */
    union { uint32_t u; float f; } v; v.f = f;
    if ((v.u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}
static inline float sg_bfround(float f) { return sg_bf2f(sg_f2bf(f)); }
static inline double sg_rand(uint32_t counter, uint32_t seed_mix) {
    uint32_t x = counter + seed_mix;
    x ^= x >> 16; x *= 0x85EBCA6Bu; x ^= x >> 13; x *= 0xC2B2AE35u; x ^= x >> 16;
    return (double)(x >> 8) * (1.0 / 16777216.0);
}

#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
float cosf(float);
#pragma omp declare simd notinbranch
float powf(float, float);
#pragma omp declare simd notinbranch
double exp(double);
#pragma omp declare simd notinbranch
double log(double);
#pragma omp declare simd notinbranch
double tanh(double);
#pragma omp declare simd notinbranch
double sin(double);
#pragma omp declare simd notinbranch
double cos(double);
#pragma omp declare simd notinbranch
double pow(double, double);

#define SG_NSLOTS 5

static int sg_body(void **restrict io, char *restrict arena) {
    (void)io; (void)arena;
    /* k1: root exp%8; work 48 */
    /*   inlined: exp%8, sub%7, reshape%3, permute%2, broadcast%6, reshape%5 */
    {
        const double *restrict in0 = (const double *)io[0];
        double *restrict t4 = (double *)(arena + 0);
        double *restrict t8 = (double *)(arena + 128);
        for (int64_t i4_s8 = 0; i4_s8 < 2; ++i4_s8) {
            for (int64_t i5 = 0; i5 < 4; ++i5) {
                t8[4 * i4_s8 + i5 + 32] = (exp((((uint8_t)((in0[i4_s8 + 6 * i5 + 26] - t4[i4_s8 + 8]) < (-708.39)) ? 0.0 : (in0[i4_s8 + 6 * i5 + 26] - t4[i4_s8 + 8])) + ((-708.39) * (double)((uint8_t)(((in0[i4_s8 + 6 * i5 + 26] - t4[i4_s8 + 8]) - (-708.39)) < 0.0))))) * (1.0 - (double)((uint8_t)(((in0[i4_s8 + 6 * i5 + 26] - t4[i4_s8 + 8]) - (-708.39)) < 0.0))));
            }
        }
    }
    /* k2: root reduce_sum%9; work 96 */
    {
        double *restrict t8 = (double *)(arena + 128);
        double *restrict t9 = (double *)(arena + 512);
        {
            double acc7_row[12];
            for (int64_t i6 = 0; i6 < 12; ++i6) acc7_row[i6] = 0.0;
            for (int64_t r7 = 0; r7 < 4; ++r7)
                for (int64_t i6 = 0; i6 < 12; ++i6) acc7_row[i6] = (acc7_row[i6] + t8[4 * i6 + r7]);
            for (int64_t i6 = 0; i6 < 12; ++i6) {
                double acc7 = acc7_row[i6];
                t9[i6] = acc7;
            }
        }
    }
    /* k4: root reduce_sum%18; work 96 */
    /*   inlined: where%17, sub%14, reshape%3, permute%2, broadcast%13, broadcast%16, constant%15 */
    {
        const uint8_t *restrict c0 = (const uint8_t *)io[4];
        const double *restrict in0 = (const double *)io[0];
        double *restrict t12 = (double *)(arena + 640);
        double *restrict t18 = (double *)(arena + 0);
        {
            double acc10_row[2];
            for (int64_t i9_s10 = 0; i9_s10 < 2; ++i9_s10) acc10_row[i9_s10] = 0.0;
            for (int64_t r10 = 0; r10 < 4; ++r10)
                for (int64_t i9_s10 = 0; i9_s10 < 2; ++i9_s10) acc10_row[i9_s10] = (acc10_row[i9_s10] + (c0[4 * i9_s10 + r10 + 40] ? (in0[i9_s10 + 6 * r10 + 28] - t12[i9_s10 + 10]) : 0.0));
            for (int64_t i9_s10 = 0; i9_s10 < 2; ++i9_s10) {
                double acc10 = acc10_row[i9_s10];
                t18[i9_s10 + 10] = acc10;
            }
        }
    }
    /* k5: root neg%22; work 24 */
    /*   inlined: neg%22, div%21, constant%20 */
    {
        double *restrict t18 = (double *)(arena + 0);
        double *restrict t22 = (double *)io[2];
        double acc11 = 0.0;
    }
    /* k6: root reduce_sum%27; work 96 */
    /*   inlined: mul%26, reshape%25, permute%24 */
    {
        const double *restrict in1 = (const double *)io[1];
        double *restrict t27 = (double *)(arena + 0);
        double *restrict t8 = (double *)(arena + 128);
        {
            double acc13_row[2];
            for (int64_t i12_s8 = 0; i12_s8 < 2; ++i12_s8) acc13_row[i12_s8] = 0.0;
            for (int64_t r13 = 0; r13 < 4; ++r13)
                for (int64_t i12_s8 = 0; i12_s8 < 2; ++i12_s8) acc13_row[i12_s8] = (acc13_row[i12_s8] + (in1[i12_s8 + 6 * r13 + 26] * t8[4 * i12_s8 + r13 + 32]));
            for (int64_t i12_s8 = 0; i12_s8 < 2; ++i12_s8) {
                double acc13 = acc13_row[i12_s8];
                t27[i12_s8 + 8] = acc13;
            }
        }
    }
    /* k7: root neg%31; work 12 */
    /*   inlined: neg%31, reshape%30, div%29, reshape%28, reshape%10 */
    {
        double *restrict t27 = (double *)(arena + 0);
        double *restrict t31 = (double *)(arena + 128);
        double *restrict t9 = (double *)(arena + 512);
    }
    /* k9: root neg%38; work 24 */
    /*   inlined: neg%38, div%37, constant%20 */
    {
        double *restrict t35 = (double *)(arena + 0);
        double *restrict t38 = (double *)io[3];
        double acc17 = 0.0;
    }
    return 0;
}

SG_HIDDEN int sg_threads = 1;
SG_HIDDEN int sg_adaptive = 1;
SG_HIDDEN unsigned sg_team_epoch;
SG_HIDDEN unsigned long long sg_fp_caller = 0x1f80u;

int sg_run(void **io, char *arena) {
    SG_FP_CALL_ENTER;
    int rc = sg_body(io, arena);
    SG_FP_CALL_LEAVE;
    return rc;
}

int sg_run_steps(void **io, char *arena, int64_t k, const int64_t *step, int64_t *done) {
    void *local[SG_NSLOTS + 1];
    int rc = 0;
    SG_FP_CALL_ENTER;
    *done = 0;
    for (int64_t t = 0; t < k; ++t) {
        for (int s = 0; s < SG_NSLOTS; ++s) local[s] = (char *)io[s] + t * step[s];
        rc = sg_body(local, arena);
        if (rc) break;
        *done = t + 1;
    }
    SG_FP_CALL_LEAVE;
    return rc;
}

void sg_set_threads(int n, int adaptive) {
    sg_threads = n > 0 ? n : 1;
    sg_adaptive = adaptive;
    ++sg_team_epoch; /* every unit's region resets its probe state on its next call */
#ifdef SG_USES_BLAS
    scipy_openblas_set_num_threads(1); /* we split products across our own threads */
#endif
    (void)n;
}


const char sg_key[] = "57100bc9be37d06b052c2863b00726dd";


static double X[48]={0.345584192064786,0.8216181435011584,0.33043707618338714,-1.303157231604361,0.9053558666731177,0.4463745723640113,-0.5369532353602852,0.5811181041963531,0.36457239618607573,0.294132496655526,0.02842224131579679,0.5467129866124469,-0.7364540870016669,-0.16290994799305278,-0.48211931267997826,0.5988462126346276,0.03972210748165899,-0.2924567509650886,-0.7819084623568421,-0.2571922406188707,0.008142180518343508,-0.2756029052993704,1.2940638143982073,1.0067243153057943,-2.7111624789659685,-1.8890132459676727,-0.17477209205516195,-0.42219041157635356,0.2136429974986111,0.21732193102256359,2.1178387550510482,-1.1120207626922813,-0.37760500712699807,2.0427716074923303,0.6467029962018469,0.6630633723762617,-0.5140063716874629,-1.6480751708556527,0.16746474422274113,0.10901408782154753,-1.2273520542445742,-0.6832266617805622,-0.07204367972722743,-0.9447516230607774,-0.09826996785221727,0.09548302746945433,0.03558623705548571,-0.5062916583143148};
static double T[48]={0.8791606182879853,-1.0717874168774442,0.9144672031287812,-0.02006345461548042,-1.2487488903344155,-0.31389947196684775,0.05410227877154389,0.27279133916445375,-0.9821881249409777,-1.107373047165193,0.19958453284708083,-0.46674961687980204,0.23550561173022522,0.7595195224783792,-1.6487873663509485,0.2543881165176173,1.2246469675357323,-0.2975268443704732,-0.8108145832375699,0.7522438271795928,0.25344651620814146,0.8958830707775604,-0.3452157100512797,-1.4818182737222112,-0.11001076471125099,-0.4458281530112322,0.7753238220475741,0.1936328483771538,-1.6308492324351012,-1.1951630801031998,0.8837890365872553,0.6797650174178466,-0.6402433659084887,-0.001048796567280681,0.4455735537761861,0.4684043358472779,0.8762421961143501,0.256485627221562,-0.09482833896849817,-0.25884806478784556,1.0557428005332512,-2.2508542750785376,-0.13865532509133732,0.03300010398406011,-1.4253489608701877,0.33281361313804664,-0.651281012443394,0.8624447963157468};
static unsigned char M[48]={0,0,1,0,0,0,0,1,1,0,0,0,0,0,1,0,0,0,0,1,0,0,0,1,0,0,0,1,1,0,0,0,0,0,1,0,0,0,0,1,0,1,0,0,1,0,0,0};

int main(void) {
    static double ar[128];
    double o2 = 0, o3 = 0;
    void *io[5] = {X, T, &o2, &o3, M};
    sg_run(io, (char *)ar);
    printf("%.17g %.17g\n", ar[8], ar[9]);
    return 0;
}
