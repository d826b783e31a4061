// precguard.capture._fused: a tensor's capture statistics in one read of its memory.
//
// Capture computes, for every tensor of every module call, its min, max, zero
// count, sum, sum of squares, per-position norms and a sample of elements.
// Through torch and NumPy each of those is a pass of its own over the tensor
// (five reads of a 32 MB logits tensor, and microseconds of dispatch per pass on
// small ones); here one loop reads each element once and updates all of them.
//
// Accuracy: every sum is accumulated in double; the square of a float32 is exact
// in double. A block of at most BLOCK elements is summed in 16 chains, the
// blocks' sums are added with Neumaier's compensation, so a total carries at
// most ~(BLOCK / 16 + 21) double roundings relative to the sum of |terms|,
// whatever the tensor's size (stats.py's error bound for the spread uses this).
//
// Non-finite values: min and max skip NaNs (a comparison with NaN is false) and
// a NaN or Inf makes the sums non-finite; the caller sees that and takes torch's
// path for such a tensor, which counts NaN and Inf.
//
// The kernels (_fused_kernels.h) are written with GCC/Clang vector types, not
// intrinsics, so they build for any target; on x86-64 they are compiled a second
// time for AVX2 with FMA, and the module chooses when it loads (the environment
// variable PRECGUARD_KERNELS=baseline forces the first, for tests). C++ rather
// than C for one reason: `a < b ? a : b` on vector types, which compiles to
// minps/maxps.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

typedef float f4 __attribute__((vector_size(16)));
typedef float f8 __attribute__((vector_size(32)));
typedef double d4 __attribute__((vector_size(32)));

// on x86-64 the kernels are compiled twice, for the baseline and for AVX2 with FMA
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define X86_CLONE 1
#include <immintrin.h>
#else
#define X86_CLONE 0
#endif
#define INLINE inline __attribute__((always_inline))
// Functions taking or returning 32-byte vectors are all inlined: no vector passes a
// call boundary, where the baseline's and the AVX2 build's ABIs differ.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace {

// a running total with Neumaier's compensation (no multiplication: nothing to fuse)
struct Neumaier {
    double sum = 0.0, carry = 0.0;
    INLINE void add(double x) {
        double t = sum + x;
        carry += std::fabs(sum) >= std::fabs(x) ? (sum - t) + x : (x - t) + sum;
        sum = t;
    }
    void add(const Neumaier &other) {
        add(other.sum);
        carry += other.carry;
    }
    double value() const { return sum + carry; }
};

// what one scan (or one thread's share of it) accumulates
struct Acc {
    double min, max;
    Neumaier sum, sum_sq;
    int64_t zeros;
};

// elements per block (summed in a kernel's chains, then added to the totals) and steps
// between flushes of the 32-bit zero counters (a lane gains at most one per step)
constexpr Py_ssize_t BLOCK = 4096;
// how far ahead of the loads the kernels prefetch: 4 KiB. The logits of a 32k vocabulary
// (33 MB, just written by the lm_head matmul) scanned in 6.0-6.7 ms without, 3.5-4.0 ms
// with it on a 2-core Xeon VM (2 KiB: 3.7-4.6 ms, 8 KiB: 3.7 ms, and slower on small
// tensors); the hardware prefetcher alone kept the loop waiting on memory.
constexpr int AHEAD = 4096;
constexpr Py_ssize_t FLUSH = Py_ssize_t(1) << 28;

// four floats at p as doubles; GCC 12 lowers __builtin_convertvector(f4 -> d4) to two
// half conversions through the stack, so the AVX2 build says vcvtps2pd itself
#define WIDEN_F32(p)                      \
    ({                                    \
        f4 v_;                            \
        std::memcpy(&v_, (p), sizeof v_); \
        __builtin_convertvector(v_, d4);  \
    })
namespace baseline {
typedef d4 D;
typedef f8 F;
constexpr int DL = 4, FL = 8;
#include "_fused_kernels.h"
}  // namespace baseline
#undef WIDEN_F32

#if X86_CLONE
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define WIDEN_F32(p) (d4) _mm256_cvtps_pd(_mm_loadu_ps(p))
namespace avx2 {
typedef d4 D;
typedef f8 F;
constexpr int DL = 4, FL = 8;
#include "_fused_kernels.h"
}  // namespace avx2
#undef WIDEN_F32
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

// the kernels this CPU runs, chosen when the module loads
struct Kernels {
    void (*scan_f32)(const float *, Py_ssize_t, Py_ssize_t, Py_ssize_t, double *, Py_ssize_t,
                     Acc *);
    void (*scan_f64)(const double *, Py_ssize_t, Py_ssize_t, Py_ssize_t, double *, Py_ssize_t,
                     Acc *);
    double (*spread_f32)(const float *, Py_ssize_t, double);
    double (*spread_f64)(const double *, Py_ssize_t, double);
    const char *name;
};

Kernels kernels = {baseline::scan_f32, baseline::scan_f64, baseline::spread_f32,
                   baseline::spread_f64, "baseline"};

void choose_kernels() {
#if X86_CLONE
    const char *forced = std::getenv("PRECGUARD_KERNELS");
    if (forced != nullptr && std::strcmp(forced, "baseline") == 0) return;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        kernels = {avx2::scan_f32, avx2::scan_f64, avx2::spread_f32, avx2::spread_f64, "avx2"};
    }
#endif
}

// a buffer released when it goes out of scope
struct Buffer {
    Py_buffer view;
    bool held = false;
    ~Buffer() {
        if (held) PyBuffer_Release(&view);
    }
    // obj's C-contiguous buffer of `itemsize`-byte items, at least `count` of them
    bool get(PyObject *obj, bool write, Py_ssize_t itemsize, Py_ssize_t count, const char *what) {
        int flags = PyBUF_C_CONTIGUOUS | (write ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(obj, &view, flags) < 0) return false;
        held = true;
        if (view.itemsize != itemsize || view.len < count * itemsize) {
            PyErr_Format(PyExc_ValueError, "%s: needs %zd items of %zd bytes", what, count,
                         itemsize);
            return false;
        }
        return true;
    }
};

// scan_rows over all rows, split into `threads` equal runs of rows on as many threads
// (the caller's one of them), each with its own totals and positions, merged in order.
// Built with OpenMP, the runs go to the OpenMP thread pool: torch's own when torch
// links the same runtime (its CPU wheels bundle libgomp.so.1, which this module then
// binds to), whose threads are awake between torch's ops, so a split pays for itself
// from tens of thousands of elements (stats.py decides). Without OpenMP each run gets
// a std::thread of its own (~20 us to start); a thread that cannot be started leaves
// its run to the caller's thread.
template <typename T>
void scan_all(const T *x, Py_ssize_t n_rows, Py_ssize_t row, double *pos, Py_ssize_t seq,
              int threads, Acc *acc) {
    typedef void (*Scan)(const T *, Py_ssize_t, Py_ssize_t, Py_ssize_t, double *, Py_ssize_t,
                         Acc *);
    Scan scan;
    if constexpr (sizeof(T) == 4) {
        scan = kernels.scan_f32;
    } else {
        scan = kernels.scan_f64;
    }
    if (threads > n_rows) threads = int(n_rows);
    if (threads <= 1) {
        scan(x, 0, n_rows, row, pos, seq, acc);
        return;
    }
    std::vector<Acc> parts(static_cast<size_t>(threads));
    std::vector<std::vector<double>> positions(static_cast<size_t>(threads));
    for (int t = 0; t < threads; t++) {
        if (seq) positions[size_t(t)].assign(size_t(seq), 0.0);
    }
    auto run = [&](int t) {
        Py_ssize_t first = n_rows * t / threads, last = n_rows * (t + 1) / threads;
        double *own = seq ? positions[size_t(t)].data() : nullptr;
        scan(x, first, last - first, row, own, seq, &parts[size_t(t)]);
    };
#ifdef _OPENMP
    // one run per thread of the team (a team smaller than asked runs the rest in turn)
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int t = 0; t < threads; t++) run(t);
#else
    std::vector<std::thread> running;
    std::vector<int> inline_parts;
    running.reserve(size_t(threads));  // no reallocation (nothing to throw) once threads run
    inline_parts.reserve(size_t(threads));
    for (int t = 1; t < threads; t++) {
        try {
            running.emplace_back(run, t);
        } catch (...) {  // no thread to be had: this one does that share too
            inline_parts.push_back(t);
        }
    }
    run(0);
    for (int t : inline_parts) run(t);
    for (auto &thread : running) thread.join();
#endif
    *acc = parts[0];
    for (int t = 1; t < threads; t++) {
        const Acc &p = parts[size_t(t)];
        if (p.min < acc->min) acc->min = p.min;
        if (p.max > acc->max) acc->max = p.max;
        acc->sum.add(p.sum);
        acc->sum_sq.add(p.sum_sq);
        acc->zeros += p.zeros;
    }
    for (int t = 0; t < threads && seq; t++) {
        for (Py_ssize_t i = 0; i < seq; i++) pos[i] += positions[size_t(t)][size_t(i)];
    }
}

// sample and per-position norms into out (elements of T): out[j] = x[at[j]] for j < k,
// then out[k + b] = the norm of positions [b * bin, (b + 1) * bin)
template <typename T>
void evidence(const T *x, const int64_t *at, Py_ssize_t k, const double *pos, Py_ssize_t seq,
              Py_ssize_t bin, T *out) {
    // memcpy: x may start at any byte (see load() in _fused_kernels.h)
    for (Py_ssize_t j = 0; j < k; j++) std::memcpy(&out[j], x + at[j], sizeof(T));
    const double top = double(std::numeric_limits<T>::max());
    for (Py_ssize_t b = 0; b * bin < seq; b++) {
        double s = 0.0;
        for (Py_ssize_t i = b * bin; i < seq && i < (b + 1) * bin; i++) s += pos[i];
        double norm = std::sqrt(s);
        // a norm beyond T's range is inf there (the cast of such a double is undefined)
        out[k + b] = norm > top ? std::numeric_limits<T>::infinity() : T(norm);
    }
}

// What scan() and stats() read: n contiguous float32 (float64 if is_double) elements at
// data in rows of `row`, the rows `seq` positions (0: none) binned by `bin`, and the
// sample's flat indices (`index`, k of them).
struct Read {
    void *data = nullptr;
    Py_ssize_t n = 0, row = 0, seq = 0, bin = 1, k = 0;
    int is_double = 0;
    long threads = 1;
    Buffer index;

    // scan()'s and stats()'s first four arguments: address, n, row, is_double
    explicit Read(PyObject *const *args)
        : data(PyLong_AsVoidPtr(args[0])),
          n(PyLong_AsSsize_t(args[1])),
          row(PyLong_AsSsize_t(args[2])),
          is_double(PyObject_IsTrue(args[3])) {}

    Py_ssize_t item() const { return is_double ? 8 : 4; }
    Py_ssize_t bins() const { return seq ? (seq + bin - 1) / bin : 0; }

    // the arguments checked, and the indices (None: no sample) held and checked in
    // range; false with an exception set
    bool check(const char *who, PyObject *indices) {
        if (PyErr_Occurred()) return false;
        if (data == nullptr || n <= 0 || row <= 0 || n % row != 0 || seq < 0 || bin <= 0 ||
            threads < 1 || threads > 1024 || (seq > 0 && (n / row) % seq != 0)) {
            PyErr_Format(PyExc_ValueError,
                         "%s(): needs a non-null address, n a multiple of row > 0, and the "
                         "rows a multiple of seq, and 1 to 1024 threads",
                         who);
            return false;
        }
        if (indices == Py_None) return true;
        if (!index.get(indices, false, 8, 0, "index")) return false;
        k = index.view.len / 8;
        const int64_t *at = static_cast<const int64_t *>(index.view.buf);
        for (Py_ssize_t j = 0; j < k; j++) {
            if (at[j] < 0 || at[j] >= n) {
                PyErr_SetString(PyExc_IndexError, "index: out of range");
                return false;
            }
        }
        return true;
    }

    // the one read without the GIL: the totals into acc, the sample and the binned norms
    // into out (k + bins() items of the data's type; unused when both are 0); false with
    // MemoryError set
    bool run(void *out, Acc *acc) const {
        const int64_t *at = k ? static_cast<const int64_t *>(index.view.buf) : nullptr;
        bool failed = false;
        Py_BEGIN_ALLOW_THREADS;
        try {  // no C++ exception may reach Python (only allocation can throw here)
            std::vector<double> pos(size_t(seq), 0.0);
            double *p = seq ? pos.data() : nullptr;
            const bool gather = k || bins();
            if (is_double) {
                const double *x = static_cast<const double *>(data);
                scan_all(x, n / row, row, p, seq, int(threads), acc);
                if (gather) evidence(x, at, k, p, seq, bin, static_cast<double *>(out));
            } else {
                const float *x = static_cast<const float *>(data);
                scan_all(x, n / row, row, p, seq, int(threads), acc);
                if (gather) evidence(x, at, k, p, seq, bin, static_cast<float *>(out));
            }
        } catch (...) {
            failed = true;
        }
        Py_END_ALLOW_THREADS;
        if (failed) PyErr_NoMemory();
        return !failed;
    }
};

PyDoc_STRVAR(scan_doc,
             "scan(address, n, row, is_double, index, out, seq, bin, threads)\n"
             "    -> (min, max, zeros, sum, sum_sq)\n\n"
             "One read of the n contiguous float32 (float64 if is_double) elements at address,\n"
             "n // row rows of row elements. Sums in double. With seq > 0 the rows are\n"
             "(..., seq) positions: out (a buffer of the input's dtype) receives the elements\n"
             "at the flat int64 indices of index (None: none), then the norm of each run of\n"
             "bin consecutive positions (the sum of squares of their rows). threads > 1 splits\n"
             "the rows among that many threads. The caller keeps the memory alive.");

PyObject *scan(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "scan() takes 9 arguments");
        return nullptr;
    }
    Read read(args);
    read.seq = PyLong_AsSsize_t(args[6]);
    read.bin = PyLong_AsSsize_t(args[7]);
    read.threads = PyLong_AsLong(args[8]);
    if (!read.check("scan", args[4])) return nullptr;
    Buffer out;
    const Py_ssize_t items = read.k + read.bins();
    if (items && !out.get(args[5], true, read.item(), items, "out")) return nullptr;
    Acc acc;
    if (!read.run(items ? out.view.buf : nullptr, &acc)) return nullptr;
    return Py_BuildValue("(ddLdd)", acc.min, acc.max, static_cast<long long>(acc.zeros),
                         acc.sum.value(), acc.sum_sq.value());
}

PyDoc_STRVAR(spread_doc,
             "spread(address, n, is_double, mean) -> float\n\n"
             "sum (x - mean)^2 over the n contiguous float32 (float64 if is_double) elements\n"
             "at address, accumulated as scan() accumulates its sums.");

PyObject *spread(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "spread() takes 4 arguments");
        return nullptr;
    }
    void *data = PyLong_AsVoidPtr(args[0]);
    const Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    const int is_double = PyObject_IsTrue(args[2]);
    const double m = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return nullptr;
    if (data == nullptr || n <= 0) {
        PyErr_SetString(PyExc_ValueError, "spread(): needs a non-null address and n > 0");
        return nullptr;
    }
    double t;
    Py_BEGIN_ALLOW_THREADS;
    t = is_double ? kernels.spread_f64(static_cast<const double *>(data), n, m)
                  : kernels.spread_f32(static_cast<const float *>(data), n, m);
    Py_END_ALLOW_THREADS;
    return PyFloat_FromDouble(t);
}

// --- a tensor's finished statistics and evidence record fields (stats.py's fast path) --

// interned keys and dtype names, made once when the module loads
struct Names {
    PyObject *min, *max, *mean, *std, *absmax, *l2, *nan, *inf, *zeros, *numel;
    PyObject *sample, *positions, *seed, *dtype, *values, *dim, *bin, *length, *norms;
    PyObject *float32, *float64;
} names;

bool make_names() {
    struct {
        PyObject **slot;
        const char *text;
    } all[] = {
        {&names.min, "min"},       {&names.max, "max"},         {&names.mean, "mean"},
        {&names.std, "std"},       {&names.absmax, "absmax"},   {&names.l2, "l2"},
        {&names.nan, "nan"},       {&names.inf, "inf"},         {&names.zeros, "zeros"},
        {&names.numel, "numel"},   {&names.sample, "sample"},   {&names.positions, "positions"},
        {&names.seed, "seed"},     {&names.dtype, "dtype"},     {&names.values, "values"},
        {&names.dim, "dim"},       {&names.bin, "bin"},         {&names.length, "length"},
        {&names.norms, "norms"},   {&names.float32, "float32"}, {&names.float64, "float64"},
    };
    for (auto &name : all) {
        *name.slot = PyUnicode_InternFromString(name.text);
        if (*name.slot == nullptr) return false;
    }
    return true;
}

// standard base64 (RFC 4648, with padding) of n bytes as a str: what pybase64's
// b64encode_as_string writes, so a record's evidence is the same bytes on either path
PyObject *base64(const unsigned char *data, Py_ssize_t n) {
    static const char digits[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    PyObject *text = PyUnicode_New(4 * ((n + 2) / 3), 127);
    if (text == nullptr) return nullptr;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        unsigned v = unsigned(data[i]) << 16 | unsigned(data[i + 1]) << 8 | data[i + 2];
        *out++ = Py_UCS1(digits[v >> 18]);
        *out++ = Py_UCS1(digits[(v >> 12) & 63]);
        *out++ = Py_UCS1(digits[(v >> 6) & 63]);
        *out++ = Py_UCS1(digits[v & 63]);
    }
    if (i < n) {
        unsigned v = unsigned(data[i]) << 16 | (i + 1 < n ? unsigned(data[i + 1]) << 8 : 0u);
        *out++ = Py_UCS1(digits[v >> 18]);
        *out++ = Py_UCS1(digits[(v >> 12) & 63]);
        *out++ = Py_UCS1(i + 1 < n ? digits[(v >> 6) & 63] : '=');
        *out++ = '=';
    }
    return text;
}

// a dict from keys and new references to values (stolen, also on failure); None if one is
PyObject *dict_of(PyObject *const *keys, PyObject **values, int count) {
    PyObject *d = PyDict_New();
    bool ok = d != nullptr;
    for (int i = 0; i < count; i++) {
        if (values[i] == nullptr) ok = false;
        if (ok && PyDict_SetItem(d, keys[i], values[i]) < 0) ok = false;
        Py_XDECREF(values[i]);
    }
    if (!ok) {
        Py_XDECREF(d);
        return nullptr;
    }
    return d;
}

// The statistics row's tail (stats.py's _fused_stats after its scan, the same double
// operations in the same order: no fused multiply-add may merge two of them, which
// -std=c++17 keeps GCC from doing and the pragma clang).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
enum Finished {
    FINISHED,    // stats[] holds min, max, mean, std, absmax, l2
    NONFINITE,   // a sum is not finite (a NaN or an Inf; float64 sums beyond range): the
                 // passes count them, as after _fused_stats' None
    PYTHON_TAIL  // sums below n tiny, a std or l2 beyond float32: _fused_stats decides
};
Finished finish(const Acc &acc, const void *data, Py_ssize_t n, Py_ssize_t row, bool is_double,
            double tiny, double unit, double stats[6]) {
    const double total = acc.sum.value(), sumsq = acc.sum_sq.value();
    const double inf = std::numeric_limits<double>::infinity();
    if (!std::isfinite(total) || !std::isfinite(sumsq)) return NONFINITE;
    if (!(double(n) * tiny <= sumsq && sumsq < inf)) return PYTHON_TAIL;
    const double mean = total / double(n);
    double spread = sumsq - total * mean;
    const double block = double(row < BLOCK ? row : BLOCK);
    double bound = sumsq * 0x1p-53;
    bound = bound * 3.0;
    bound = bound * (block / 16.0 + 22.0);
    if (spread * unit < 4.0 * bound) {
        Py_BEGIN_ALLOW_THREADS;
        spread = is_double ? kernels.spread_f64(static_cast<const double *>(data), n, mean)
                           : kernels.spread_f32(static_cast<const float *>(data), n, mean);
        Py_END_ALLOW_THREADS;
    }
    const double f32_max = double(std::numeric_limits<float>::max());
    const double std_ = n > 1 ? std::sqrt((0.0 > spread ? 0.0 : spread) / double(n - 1)) : 0.0;
    const double l2 = std::sqrt(sumsq);
    if (std_ > f32_max || l2 > f32_max) return PYTHON_TAIL;
    const double amin = std::fabs(acc.min), amax = std::fabs(acc.max);
    stats[0] = acc.min;
    stats[1] = acc.max;
    stats[2] = mean;
    stats[3] = std_;
    stats[4] = amax > amin ? amax : amin;
    stats[5] = l2;
    return FINISHED;
}

PyDoc_STRVAR(stats_doc,
             "stats(address, n, row, is_double, plan, threads, tiny, unit)\n"
             "    -> (stats, evidence), False or None\n\n"
             "scan() of a contiguous float32 (float64 if is_double) tensor, finished: its\n"
             "record's stats dict, and with an evidence plan (stats.py's EvidencePlan, or None)\n"
             "its record's sample and positions fields, their values base64-encoded. False\n"
             "where a sum is not finite (a NaN or an Inf: the caller's passes count them),\n"
             "None where the sums are out of the range in which this tail decides (tiny: the\n"
             "smallest normal number of the precision the dtype's elements are squared in;\n"
             "unit: the statistics' unit roundoff): the caller's Python tail then does.");

PyObject *stats(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "stats() takes 8 arguments");
        return nullptr;
    }
    PyObject *plan = args[4];
    Read read(args);
    read.threads = PyLong_AsLong(args[5]);
    const double tiny = PyFloat_AsDouble(args[6]), unit = PyFloat_AsDouble(args[7]);
    if (PyErr_Occurred()) return nullptr;
    // the plan's fields, as evidence.EvidencePlan orders them
    enum { SEED, INDEX, HOST_INDEX, SEQ_DIM, BIN, BINS, LENGTH, PLAN_FIELDS };
    if (plan != Py_None && (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != PLAN_FIELDS)) {
        PyErr_SetString(PyExc_TypeError, "stats(): plan must be an EvidencePlan or None");
        return nullptr;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    // a record's evidence is little-endian: evidence.py's encode() swaps the bytes here
    if (plan != Py_None) Py_RETURN_NONE;
#endif
    if (plan != Py_None && PyTuple_GET_ITEM(plan, SEQ_DIM) != Py_None) {
        read.seq = PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, LENGTH));
        read.bin = PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, BIN));
    }
    if (!read.check("stats", plan == Py_None ? Py_None : PyTuple_GET_ITEM(plan, HOST_INDEX))) {
        return nullptr;
    }
    const Py_ssize_t item = read.item(), k = read.k, bins = read.bins(), n = read.n;
    std::vector<unsigned char> values;
    try {
        values.resize(size_t((k + bins) * item));
    } catch (...) {
        return PyErr_NoMemory();
    }
    Acc acc;
    if (!read.run(values.data(), &acc)) return nullptr;
    double row_stats[6];
    switch (finish(acc, read.data, n, read.row, read.is_double, tiny, unit, row_stats)) {
        case NONFINITE:
            Py_RETURN_FALSE;
        case PYTHON_TAIL:
            Py_RETURN_NONE;
        case FINISHED:
            break;
    }
    PyObject *const stats_keys[] = {names.min,    names.max, names.mean, names.std,   names.absmax,
                                    names.l2,     names.nan, names.inf,  names.zeros, names.numel};
    PyObject *stats_values[] = {
        PyFloat_FromDouble(row_stats[0]), PyFloat_FromDouble(row_stats[1]),
        PyFloat_FromDouble(row_stats[2]), PyFloat_FromDouble(row_stats[3]),
        PyFloat_FromDouble(row_stats[4]), PyFloat_FromDouble(row_stats[5]),
        PyLong_FromLong(0),               PyLong_FromLong(0),
        PyLong_FromLongLong(acc.zeros),   PyLong_FromSsize_t(n)};
    PyObject *stats_dict = dict_of(stats_keys, stats_values, 10);
    if (stats_dict == nullptr) return nullptr;
    if (plan == Py_None) return Py_BuildValue("(NO)", stats_dict, Py_None);
    PyObject *dtype = read.is_double ? names.float64 : names.float32;
    PyObject *const sample_keys[] = {names.seed, names.dtype, names.values};
    PyObject *seed = PyTuple_GET_ITEM(plan, SEED);
    Py_INCREF(seed);
    Py_INCREF(dtype);
    PyObject *sample_values[] = {seed, dtype, base64(values.data(), k * item)};
    PyObject *fields[] = {dict_of(sample_keys, sample_values, 3), nullptr};
    int count = 1;
    PyObject *const field_keys[] = {names.sample, names.positions};
    if (read.seq) {
        PyObject *const position_keys[] = {names.dim, names.bin, names.length, names.dtype,
                                           names.norms};
        PyObject *position_values[] = {PyTuple_GET_ITEM(plan, SEQ_DIM), PyTuple_GET_ITEM(plan, BIN),
                                       PyTuple_GET_ITEM(plan, LENGTH), dtype, nullptr};
        for (int i = 0; i < 4; i++) Py_INCREF(position_values[i]);
        position_values[4] = base64(values.data() + k * item, bins * item);
        fields[1] = dict_of(position_keys, position_values, 5);
        count = 2;
    }
    PyObject *evidence_dict = dict_of(field_keys, fields, count);
    if (evidence_dict == nullptr) {
        Py_DECREF(stats_dict);
        return nullptr;
    }
    return Py_BuildValue("(NN)", stats_dict, evidence_dict);
}

PyMethodDef methods[] = {
    {"scan", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(scan)),
     METH_FASTCALL, scan_doc},
    {"spread", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(spread)),
     METH_FASTCALL, spread_doc},
    {"stats", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(stats)),
     METH_FASTCALL, stats_doc},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_fused",
    "A tensor's capture statistics in one read of its memory (see _fused.cpp).",
    -1,
    methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__fused(void) {
    choose_kernels();
    if (!make_names()) return nullptr;
    PyObject *m = PyModule_Create(&module);
    // whether a split scan runs on the OpenMP thread pool (1) or on threads of its own
#ifdef _OPENMP
    const long openmp = 1;
#else
    const long openmp = 0;
#endif
    // which kernels run here ("avx2" or "baseline"), for tests and the benchmarks; the
    // block its sums' rounding bound depends on (stats.py's one-pass rule); OPENMP above
    if (m != nullptr && (PyModule_AddStringConstant(m, "kernels", kernels.name) < 0 ||
                         PyModule_AddIntConstant(m, "BLOCK", long(BLOCK)) < 0 ||
                         PyModule_AddIntConstant(m, "OPENMP", openmp) < 0)) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
