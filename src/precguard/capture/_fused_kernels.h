// The kernels of _fused.cpp, included there once per instruction set, each time in a
// namespace of its own under that set's target pragma (so GCC lowers the vector
// types for that target). Includes nothing: the includer has, and has defined in
// the namespace the vector types D (DL doubles) and F (FL floats), and WIDEN_F32(p),
// DL floats at p as a D.

// an unaligned load of vector V from p (memcpy: any alignment, compiled to one load).
// Every read of the tensor goes through it, scalars too: a tensor may start at any
// byte (torch.frombuffer(..., offset=1)), where a plain float load is undefined.
template <typename V, typename T>
static INLINE V load(const T *p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// How elements of T are read: min, max and zeros on vectors of M (F or D), the sums on
// DL elements at a time widened to double.
template <typename T>
struct Lanes;

template <>
struct Lanes<float> {
    typedef F M;
    static constexpr int width = FL;
    static INLINE D wide(const float *p) { return WIDEN_F32(p); }
};

template <>
struct Lanes<double> {
    typedef D M;
    static constexpr int width = DL;
    static INLINE D wide(const double *p) { return load<D>(p); }
};

// elements per step: four chains of DL lanes for each sum hide the adds' latency
constexpr int STEP = 4 * DL;
static_assert(BLOCK % STEP == 0, "a block is whole steps");

// ask for the cache lines AHEAD bytes past the step at p (a prefetch never faults, also
// past the tensor's end)
template <typename T>
static INLINE void prefetch(const T *p) {
    for (int c = 0; c < int(sizeof(T)) * STEP; c += 64) {
        __builtin_prefetch(reinterpret_cast<const char *>(p) + AHEAD + c);
    }
}

// the four chains' total: the chains pairwise, then the lanes
static INLINE double hsum(const D *v) {
    D s = (v[0] + v[1]) + (v[2] + v[3]);
    double t = 0.0;
    for (int k = 0; k < DL; k++) t += s[k];
    return t;
}

// min, max, zeros, and the Neumaier totals of the sum and the sum of squares of n_rows
// rows of `row` elements at x, the first of which is row first_row of the tensor;
// pos[r % seq] += tensor row r's sum of squares when pos is set. Each block of at most
// BLOCK elements is summed in four chains of DL lanes.
template <typename T>
INLINE void scan_rows(const T *x, Py_ssize_t first_row, Py_ssize_t n_rows, Py_ssize_t row,
                      double *pos, Py_ssize_t seq, Acc *acc) {
    typedef Lanes<T> L;
    typedef typename L::M M;
    typedef decltype(M() < M()) C;  // the comparison's lanes: -1 where true
    constexpr int VECTORS = STEP / L::width;
    M lo[VECTORS], hi[VECTORS];
    C zeros[VECTORS];
    const M zero = M() - M();
    const T first = load<T>(x + first_row * row);
    for (int j = 0; j < VECTORS; j++) {
        lo[j] = zero + first;
        hi[j] = lo[j];
        zeros[j] = C() - C();
    }
    Neumaier total, squares;
    int64_t zero_total = 0;
    Py_ssize_t since_flush = 0;
    T tail_lo = first, tail_hi = first;
    for (Py_ssize_t r = first_row; r < first_row + n_rows; r++) {
        const T *p = x + r * row;
        double row_sq = 0.0;
        for (Py_ssize_t start = 0; start < row; start += BLOCK) {
            const Py_ssize_t end = row - start < BLOCK ? row : start + BLOCK;
            D sum[4], sq[4];
            for (int q = 0; q < 4; q++) sum[q] = sq[q] = D() - D();
            Py_ssize_t i = start;
            for (; i + STEP <= end; i += STEP) {
                prefetch(p + i);
                for (int j = 0; j < VECTORS; j++) {
                    M v = load<M>(p + i + j * L::width);
                    lo[j] = v < lo[j] ? v : lo[j];
                    hi[j] = v > hi[j] ? v : hi[j];
                    zeros[j] -= v == zero;
                }
                for (int q = 0; q < 4; q++) {
                    D w = L::wide(p + i + DL * q);
                    sum[q] += w;
                    sq[q] += w * w;
                }
                if (++since_flush == FLUSH) {
                    for (int j = 0; j < VECTORS; j++) {
                        for (int k = 0; k < L::width; k++) zero_total += zeros[j][k];
                        zeros[j] = C() - C();
                    }
                    since_flush = 0;
                }
            }
            double block_sum = hsum(sum), block_sq = hsum(sq);
            for (; i < end; i++) {
                const T v = load<T>(p + i);
                if (v < tail_lo) tail_lo = v;
                if (v > tail_hi) tail_hi = v;
                zero_total += v == 0;
                double w = v;
                block_sum += w;
                block_sq += w * w;
            }
            total.add(block_sum);
            squares.add(block_sq);
            row_sq += block_sq;
        }
        if (pos != nullptr) pos[r % seq] += row_sq;
    }
    for (int j = 0; j < VECTORS; j++) {
        for (int k = 0; k < L::width; k++) {
            if (lo[j][k] < tail_lo) tail_lo = lo[j][k];
            if (hi[j][k] > tail_hi) tail_hi = hi[j][k];
            zero_total += zeros[j][k];
        }
    }
    acc->min = tail_lo;
    acc->max = tail_hi;
    acc->sum = total;
    acc->sum_sq = squares;
    acc->zeros = zero_total;
}

// sum (x - m)^2 over n elements at x: blocks as in scan_rows, their sums added by Neumaier
template <typename T>
INLINE double spread_of(const T *x, Py_ssize_t n, double m) {
    typedef Lanes<T> L;
    Neumaier total;
    for (Py_ssize_t start = 0; start < n; start += BLOCK) {
        const Py_ssize_t end = n - start < BLOCK ? n : start + BLOCK;
        D s[4];
        for (int q = 0; q < 4; q++) s[q] = D() - D();
        Py_ssize_t i = start;
        for (; i + STEP <= end; i += STEP) {
            prefetch(x + i);
            for (int q = 0; q < 4; q++) {
                D w = L::wide(x + i + DL * q) - m;
                s[q] += w * w;
            }
        }
        double block = hsum(s);
        for (; i < end; i++) {
            double v = double(load<T>(x + i)) - m;
            block += v * v;
        }
        total.add(block);
    }
    return total.value();
}

void scan_f32(const float *x, Py_ssize_t first_row, Py_ssize_t n_rows, Py_ssize_t row,
              double *pos, Py_ssize_t seq, Acc *acc) {
    scan_rows(x, first_row, n_rows, row, pos, seq, acc);
}
void scan_f64(const double *x, Py_ssize_t first_row, Py_ssize_t n_rows, Py_ssize_t row,
              double *pos, Py_ssize_t seq, Acc *acc) {
    scan_rows(x, first_row, n_rows, row, pos, seq, acc);
}
double spread_f32(const float *x, Py_ssize_t n, double m) { return spread_of(x, n, m); }
double spread_f64(const double *x, Py_ssize_t n, double m) { return spread_of(x, n, m); }
