/* analysis.allocator._replaycore: the replays of the allocator model and of the recorded trace, in C.
 *
 * Both keep their whole state in C structures (hash maps keyed by address, arrays, a block arena),
 * read their inputs from numpy columns, and hand their results back once. No number of the
 * allocator's rules is written here: the Python caller passes each one in, taken from its one
 * definition (analysis/allocator/config.py).
 *
 *   recorded_core(act, addr, size, stream, pool, stops, params) -> state  (replayer._Replayer)
 *   policy_engine(model, params) -> (failed, state, counts)               (cachemodel._Model.run, whole:
 *       in _policycore.c, compiled into this module; registered below)
 *   policy_scan(ops, sizes, lks, raddrs, op_alloc, op_oom, op_free, op_free_req) -> scan
 *       (policy_engine's pass over its requests before the loop, the frees paired with their allocs'
 *       slots; kept by compiled.py for columns that several replays share)
 *   alloc_ends(act, addr, alloc, free, out, size) -> (allocs, alternates) (stacks.alloc_lifetimes' pairing,
 *       policy.trace_is_complete's order of allocs and frees)
 *   block_order(act, addr, stream, pool, next_kind, lanes, alloc, free, out, size) -> (first wrong pair, alternates)
 *       (eventorder.check_event_order; the pairing of alloc_ends in the same pass)
 *
 * analysis/allocator/compiled.py decides whether these run; the Python loops stay the reference
 * (tests/analysis/test_replaycore.py compares both on every fixture and on the captures).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef __int128 i128;

/* ------------------------------------------------------------------ helpers */

/* A Python int as a 128-bit signed value (every number here is far below 2**127). */
static int as_i128(PyObject *o, i128 *out) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (!overflow) {
        *out = v;
        return 0;
    }
    unsigned char buf[16];
    if (_PyLong_AsByteArray((PyLongObject *)o, buf, sizeof buf, 1, 1) < 0) return -1;
    i128 r;
    memcpy(&r, buf, sizeof r);
    *out = r;
    return 0;
}

/* CPython 3.11's int layout (30-bit digits, the sign in ob_size): small exact ints are read and made
 * straight from their digits. Other interpreters take the C API. */
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
#define DIGITS_311 1
#else
#define DIGITS_311 0
#endif

static inline int as_i64(PyObject *o, int64_t *out) {
#if DIGITS_311
    if (PyLong_CheckExact(o)) {
        Py_ssize_t sz = Py_SIZE(o);
        const digit *d = ((PyLongObject *)o)->ob_digit;
        if (sz >= -2 && sz <= 2) {
            int64_t v = sz == 0 ? 0 : (sz == 1 || sz == -1) ? (int64_t)d[0] : ((int64_t)d[1] << PyLong_SHIFT) | d[0];
            *out = sz < 0 ? -v : v;
            return 0;
        }
    }
#endif
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* ------------------------------------------------------------------ the recorded replay (replayer._Replayer) */

/* The recorded replay's whole state lives in C here (a RecCore object owned by the replayer): the
 * dicts keyed by address are open-addressing maps of int64, the outputs int64 vectors, the block sizes
 * one int64 array. Every method of replayer._Replayer that moves the state is written again below,
 * statement for statement, with the same errors (KeyError, IndexError) where the Python one would
 * raise them; only _issue (counts the problems), _meta_of_event (a pure function of the trace) and, for
 * roundup_power2_divisions, cfg.round_size are called back. Python dicts iterate in insertion order,
 * which _free_containing and _used_containing rely on: each entry keeps the number of its insertion. */

#define MAP_EMPTY INT64_MIN

/* rep._issue(i, kind, reason): raises in strict mode. 0 / -1. */
static int call_issue(PyObject *rep, int64_t i, const char *kind, const char *reason) {
    PyObject *r = PyObject_CallMethod(rep, "_issue", "Lss", (long long)i, kind, reason);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

typedef struct {
    int64_t *k, *v, *s; /* keys, values, insertion numbers */
    size_t cap, len;
    int shift;
    int sparse; /* the map grows past a load of 1 / 2**sparse */
    int64_t seq;
} Map;

/* The loads the maps grow past. The replay's maps hold the live blocks, the free ones and the segments:
 * a few hundred entries, so at 1/8 they still fit in L2 (a few hundred KB in all), and a probe mostly
 * finds its key or its empty slot first. At 1/2 (1.6 probes a search on the 460 MB trace; 1.08 at 1/8)
 * the probe loop's exit was mispredicted often enough to cost 40% of the recorded replay's pass
 * (87 -> 49 ms CPU). A map that holds every address of the trace (block_order's AddrMap) keeps 1/2. */
#define MAP_SPARSE_LIVE 3

typedef struct {
    int64_t *v;
    size_t len, cap;
} Vec;

static int map_init(Map *m, size_t cap, int sparse) {
    m->cap = cap;
    m->sparse = sparse;
    m->len = 0;
    m->seq = 0;
    int bits = 0;
    while (((size_t)1 << bits) < cap) bits++;
    m->shift = 64 - bits;
    m->k = PyMem_Malloc(cap * sizeof(int64_t));
    m->v = PyMem_Malloc(cap * sizeof(int64_t));
    m->s = PyMem_Malloc(cap * sizeof(int64_t));
    if (!m->k || !m->v || !m->s) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t j = 0; j < cap; j++) m->k[j] = MAP_EMPTY;
    return 0;
}

static void map_free(Map *m) {
    PyMem_Free(m->k);
    PyMem_Free(m->v);
    PyMem_Free(m->s);
    m->k = m->v = m->s = NULL;
}

static inline size_t map_home(const Map *m, int64_t key) {
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> m->shift);
}

static inline Py_ssize_t map_find(const Map *m, int64_t key) {
    size_t mask = m->cap - 1, j = map_home(m, key);
    for (;;) {
        int64_t x = m->k[j];
        if (x == key) return (Py_ssize_t)j;
        if (x == MAP_EMPTY) return -1;
        j = (j + 1) & mask;
    }
}

static inline int map_get(const Map *m, int64_t key, int64_t *out) {
    Py_ssize_t j = map_find(m, key);
    if (j < 0) return 0;
    *out = m->v[j];
    return 1;
}

static void map_put_new(Map *m, int64_t key, int64_t val, int64_t seq) {
    size_t mask = m->cap - 1, j = map_home(m, key);
    while (m->k[j] != MAP_EMPTY) j = (j + 1) & mask;
    m->k[j] = key;
    m->v[j] = val;
    m->s[j] = seq;
    m->len++;
}

static int map_grow(Map *m) {
    Map old = *m;
    if (map_init(m, old.cap * 2, old.sparse) < 0) {
        map_free(m);
        *m = old;
        return -1;
    }
    m->seq = old.seq;
    for (size_t j = 0; j < old.cap; j++)
        if (old.k[j] != MAP_EMPTY) map_put_new(m, old.k[j], old.v[j], old.s[j]);
    map_free(&old);
    return 0;
}

/* d[key] = val: an existing key keeps its place in the insertion order, as in a dict. */
static inline int map_set(Map *m, int64_t key, int64_t val) {
    size_t mask = m->cap - 1, j = map_home(m, key);
    for (;;) { /* one probe: a new key goes where the search met the empty slot, as map_put_new would put it */
        int64_t x = m->k[j];
        if (x == key) {
            m->v[j] = val;
            return 0;
        }
        if (x == MAP_EMPTY) break;
        j = (j + 1) & mask;
    }
    if (((m->len + 1) << m->sparse) > m->cap) {
        if (map_grow(m) < 0) return -1;
        map_put_new(m, key, val, m->seq++);
        return 0;
    }
    m->k[j] = key;
    m->v[j] = val;
    m->s[j] = m->seq++;
    m->len++;
    return 0;
}

/* d[key] = val where a dict would have deleted key and inserted it again since (so it moves to the end of
 * the insertion order): a merge of free blocks keeps the entry it would pop and set again, and moves it
 * here, where a deletion (its entries shifted back) and an insertion cost a probe each. */
static inline int map_set_last(Map *m, int64_t key, int64_t val) {
    Py_ssize_t j = map_find(m, key);
    if (j < 0) return map_set(m, key, val);
    m->v[j] = val;
    m->s[j] = m->seq++;
    return 0;
}

static inline void map_del_at(Map *m, size_t i) {
    size_t mask = m->cap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (m->k[j] == MAP_EMPTY) break;
        size_t h = map_home(m, m->k[j]);
        /* the entry at j stays unless its home lies cyclically outside (i, j] */
        int stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            m->k[i] = m->k[j];
            m->v[i] = m->v[j];
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->k[i] = MAP_EMPTY;
    m->len--;
}

/* d.pop(key) -> found */
static inline int map_pop(Map *m, int64_t key, int64_t *out) {
    Py_ssize_t j = map_find(m, key);
    if (j < 0) return 0;
    if (out) *out = m->v[j];
    map_del_at(m, (size_t)j);
    return 1;
}

static void map_clear(Map *m) {
    for (size_t j = 0; j < m->cap; j++) m->k[j] = MAP_EMPTY;
    m->len = 0;
}

static int vec_push(Vec *a, int64_t x) {
    if (a->len == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        int64_t *v = PyMem_Realloc(a->v, cap * sizeof(int64_t));
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->len++] = x;
    return 0;
}

static size_t vec_bisect_left(const Vec *a, int64_t x) {
    size_t lo = 0, hi = a->len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->v[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static size_t vec_bisect_right(const Vec *a, int64_t x) {
    size_t lo = 0, hi = a->len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (x < a->v[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

static int vec_insort(Vec *a, int64_t x) {
    size_t j = vec_bisect_right(a, x);
    if (vec_push(a, x) < 0) return -1;
    memmove(a->v + j + 1, a->v + j, (a->len - 1 - j) * sizeof(int64_t));
    a->v[j] = x;
    return 0;
}

/* del a[j], an IndexError past the end (as a list's del) */
static int vec_del(Vec *a, size_t j) {
    if (j >= a->len) {
        PyErr_SetString(PyExc_IndexError, "list assignment index out of range");
        return -1;
    }
    memmove(a->v + j, a->v + j + 1, (a->len - 1 - j) * sizeof(int64_t));
    a->len--;
    return 0;
}

static int key_error(int64_t key) {
    PyObject *k = PyLong_FromLongLong(key);
    if (k) {
        PyErr_SetObject(PyExc_KeyError, k);
        Py_DECREF(k);
    }
    return -1;
}

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    PyObject *act_o; /* bytes: the action codes */
    const unsigned char *act;
    Py_buffer addr_b, size_b;
    const int64_t *addr, *size;
    PyObject *stream, *pool; /* the trace's columns, read at the rare segment_map */
    PyObject *round_size, *inconsistent, *metas;
    int plain, strict;
    int64_t min_block, small;
    i128 over_s, below_s, over_l, below_l;
    long alloc, free_requested, free_completed, seg_alloc, seg_free, seg_map, seg_unmap;
    Map free_sz, free_end, used, seg_size, seg_end, seg_meta, fcount;
    Vec starts, dist, stops;
    Vec m_stream, m_pool, m_exp, m_large; /* the fields of metas[k] the replay reads */
    int64_t tmin, tlimit, cur, cmode, n_exp, track_limit;
    int64_t *bs;
    Py_ssize_t bs_len, bs_cap;
    Vec ns_i, ns_v, lf_i, lf_v, ignored, aa_i, aa_v, ac_i, ac_v;
    Vec wf_i, wf_v; /* whole free segments of the default large pool: (event, +1 | -1) */
    /* core_columns' checkpoints (CP_WIDTH int64 before every CP_EVERY-th event), from which core_columns_at
     * reads its columns at any event (NULL: none kept) */
    int64_t *cp;
    /* core_columns(True, ...) writes allocated over bs[0, n) (in_place): the block sizes are read no more but
     * by the later passes over the columns (core_columns_at, the four columns whole), which take an alloc's
     * from allocated's step there and a completion's from its request's step just before; xs_i / xs_v hold
     * those of the allocs and completions whose steps do not give them (block_size_at). The scatter form
     * writes allocated into al_own instead. The core exports the column (its buffer) once written. */
    int in_place;
    int64_t *al_own;
    Vec xs_i, xs_v;
    PyObject *rep; /* borrowed, during run() only: where _issue and _meta_of_event are called */
} RecCore;

static void core_dealloc(RecCore *c) {
    Map *maps[] = {&c->free_sz, &c->free_end, &c->used, &c->seg_size, &c->seg_end, &c->seg_meta, &c->fcount};
    for (int k = 0; k < 7; k++) map_free(maps[k]);
    Vec *vecs[] = {&c->starts, &c->dist,  &c->stops, &c->m_stream, &c->m_pool, &c->m_exp, &c->ns_i, &c->ns_v,
                   &c->lf_i,   &c->lf_v,  &c->ignored, &c->aa_i,   &c->aa_v,   &c->ac_i,  &c->ac_v,
                   &c->m_large, &c->wf_i, &c->wf_v, &c->xs_i, &c->xs_v};
    for (int k = 0; k < 20; k++) PyMem_Free(vecs[k]->v);
    PyMem_Free(c->bs);
    PyMem_Free(c->al_own);
    PyMem_Free(c->cp);
    if (c->addr_b.obj) PyBuffer_Release(&c->addr_b);
    if (c->size_b.obj) PyBuffer_Release(&c->size_b);
    Py_XDECREF(c->act_o);
    Py_XDECREF(c->stream);
    Py_XDECREF(c->pool);
    Py_XDECREF(c->round_size);
    Py_XDECREF(c->inconsistent);
    Py_XDECREF(c->metas);
    PyObject_Free(c);
}

/* -- the state's moves (replayer._Replayer's methods of the same names) */

static int c_issue(RecCore *c, int64_t i, const char *kind, const char *reason) { return call_issue(c->rep, i, kind, reason); }

static int c_ignore(RecCore *c, int64_t i, const char *kind, const char *reason) {
    return c_issue(c, i, kind, reason) < 0 || vec_push(&c->ignored, i) < 0 ? -1 : 0;
}

static void c_raise(RecCore *c, int64_t i, const char *reason) {
    PyObject *exc = PyObject_CallFunction(c->inconsistent, "Ls", (long long)i, reason);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

static int c_record_largest(RecCore *c, int64_t i) {
    if (c->dist.len == 0) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return -1;
    }
    return vec_push(&c->lf_i, i) < 0 || vec_push(&c->lf_v, c->dist.v[c->dist.len - 1]) < 0 ? -1 : 0;
}

static int c_ns(RecCore *c, int64_t i, int64_t v) {
    return vec_push(&c->ns_i, i) < 0 || vec_push(&c->ns_v, v) < 0 ? -1 : 0;
}

/* _Replayer._whole_free: a whole segment at `start` turned free (+1) or stopped being so (-1); recorded
 * where it is a segment the GC may free (the default pool's, large, not expandable) */
static int c_wf(RecCore *c, int64_t i, int64_t start, int64_t v) {
    int64_t meta;
    if (!map_get(&c->seg_meta, start, &meta)) return 0;
    if (c->m_pool.v[meta] != 0 || !c->m_large.v[meta] || c->m_exp.v[meta]) return 0;
    return vec_push(&c->wf_i, i) < 0 || vec_push(&c->wf_v, v) < 0 ? -1 : 0;
}

/* _retrack: the tracked sizes are those at least a quarter of the largest free block */
static int c_retrack(RecCore *c) {
    int64_t largest = 0;
    int any = 0;
    Map *f = &c->free_sz;
    for (size_t j = 0; j < f->cap; j++)
        if (f->k[j] != MAP_EMPTY && (!any || f->v[j] > largest)) {
            largest = f->v[j];
            any = 1;
        }
    c->tmin = largest >> 2;
    map_clear(&c->fcount);
    for (size_t j = 0; j < f->cap; j++) {
        if (f->k[j] == MAP_EMPTY || f->v[j] < c->tmin) continue;
        int64_t cnt = 0;
        map_get(&c->fcount, f->v[j], &cnt);
        if (map_set(&c->fcount, f->v[j], cnt + 1) < 0) return -1;
    }
    c->dist.len = 0;
    if (vec_push(&c->dist, 0) < 0) return -1;
    Map *fc = &c->fcount;
    for (size_t j = 0; j < fc->cap; j++)
        if (fc->k[j] != MAP_EMPTY && vec_insort(&c->dist, fc->k[j]) < 0) return -1;
    int64_t twice = 2 * (int64_t)c->dist.len;
    c->tlimit = twice > c->track_limit ? twice : c->track_limit;
    return 0;
}

/* c = fcount[size]; if c > 1: fcount[size] = c - 1 else: del fcount[size]; del dist[bisect_left(dist, size)] */
static int c_count_down(RecCore *c, int64_t size, int *emptied) {
    Py_ssize_t j = map_find(&c->fcount, size);
    if (j < 0) return key_error(size);
    if (c->fcount.v[j] > 1) {
        c->fcount.v[j]--;
        *emptied = 0;
        return 0;
    }
    map_del_at(&c->fcount, (size_t)j);
    *emptied = 1;
    return vec_del(&c->dist, vec_bisect_left(&c->dist, size));
}

/* c = fcount.get(size, 0); if c: fcount[size] = c + 1 else: fcount[size] = 1; insort(dist, size) */
static int c_count_up(RecCore *c, int64_t size, int *added) {
    Py_ssize_t j = map_find(&c->fcount, size);
    if (j >= 0 && c->fcount.v[j]) {
        c->fcount.v[j]++;
        *added = 0;
        return 0;
    }
    *added = 1;
    return map_set(&c->fcount, size, 1) < 0 || vec_insort(&c->dist, size) < 0 ? -1 : 0;
}

static void c_segments_changed(RecCore *c) {
    c->cmode = c->n_exp == 0 ? 0 : (c->n_exp == (int64_t)c->seg_size.len ? 1 : 2);
}

/* _segment_of: -> 1 and *start, or 0 (None) */
static int c_segment_of(RecCore *c, int64_t addr, int64_t *start) {
    size_t j = vec_bisect_right(&c->starts, addr);
    if (j == 0) return 0;
    int64_t s = c->starts.v[j - 1], size;
    if (!map_get(&c->seg_size, s, &size)) return key_error(s);
    if (addr < s + size) {
        *start = s;
        return 1;
    }
    return 0;
}

static int c_meta_of_start(RecCore *c, int64_t start, int64_t *meta) {
    return map_get(&c->seg_meta, start, meta) ? 0 : key_error(start);
}

/* _counts_split: whether a free block at addr counts in inactive_split; 1 / 0 / -1 */
static int c_counts_split(RecCore *c, int64_t addr) {
    if (c->cmode != 2) return c->cmode == 0;
    int64_t seg, meta;
    int found = c_segment_of(c, addr, &seg);
    if (found <= 0) return found;
    if (c_meta_of_start(c, seg, &meta) < 0) return -1;
    return !c->m_exp.v[meta];
}

static int c_add_segment(RecCore *c, int64_t start, int64_t size, int64_t meta) {
    if (vec_insort(&c->starts, start) < 0 || map_set(&c->seg_size, start, size) < 0 ||
        map_set(&c->seg_meta, start, meta) < 0)
        return -1;
    if (c->m_exp.v[meta]) {
        if (map_set(&c->seg_end, start + size, start) < 0) return -1;
        c->n_exp++;
    }
    c_segments_changed(c);
    return 0;
}

static int c_drop_segment(RecCore *c, int64_t start, int64_t *meta) {
    int64_t size;
    if (vec_del(&c->starts, vec_bisect_left(&c->starts, start)) < 0) return -1;
    if (!map_pop(&c->seg_size, start, &size) || !map_pop(&c->seg_meta, start, meta)) return key_error(start);
    if (c->m_exp.v[*meta]) {
        if (!map_pop(&c->seg_end, start + size, NULL)) return key_error(start + size);
        c->n_exp--;
    }
    c_segments_changed(c);
    return 0;
}

/* the nonsplit record of _add_free / _remove_free */
static int c_ns_slow(RecCore *c, int64_t start, int64_t size, int64_t v) {
    int64_t s;
    int rec = map_get(&c->seg_size, start, &s) && s == size;
    if (rec && c->cur >= 0 && c_wf(c, c->cur, start, v > 0 ? 1 : -1) < 0) return -1;
    if (!rec) {
        int cs = c_counts_split(c, start);
        if (cs < 0) return -1;
        rec = !cs;
    }
    return rec && c->cur >= 0 ? c_ns(c, c->cur, v) : 0;
}

/* free_sz[start] = size; free_end[start + size] = start; counted, with the largest free size recorded at
 * event `at` when a new size is tracked (_add_free's first half, and the hot split of c_alloc) */
static int c_track_free(RecCore *c, int64_t start, int64_t size, int64_t at) {
    if (map_set(&c->free_sz, start, size) < 0 || map_set(&c->free_end, start + size, start) < 0) return -1;
    if (size >= c->tmin) {
        int added;
        if (c_count_up(c, size, &added) < 0) return -1;
        if (added) {
            if ((int64_t)c->dist.len > c->tlimit && c_retrack(c) < 0) return -1;
            if (c_record_largest(c, at) < 0) return -1;
        }
    }
    return 0;
}

static int c_add_free(RecCore *c, int64_t start, int64_t size) {
    if (c_track_free(c, start, size, c->cur) < 0) return -1;
    return c_ns_slow(c, start, size, size);
}

static int c_remove_free(RecCore *c, int64_t start, int64_t *out) {
    int64_t size;
    if (!map_pop(&c->free_sz, start, &size)) return key_error(start);
    if (!map_pop(&c->free_end, start + size, NULL)) return key_error(start + size);
    if (size >= c->tmin) {
        int emptied;
        if (c_count_down(c, size, &emptied) < 0) return -1;
        if (emptied) {
            if (c->dist.len == 1 && c_retrack(c) < 0) return -1;
            if (c_record_largest(c, c->cur) < 0) return -1;
        }
    }
    if (out) *out = size;
    return c_ns_slow(c, start, size, -size);
}

/* the entry of m (free_sz, or used with the sizes in bs) that holds addr, first in insertion order */
static int c_containing(RecCore *c, const Map *m, int sizes_in_bs, int64_t addr, int64_t *out) {
    int found = 0;
    int64_t best = 0;
    for (size_t j = 0; j < m->cap; j++) {
        int64_t s = m->k[j];
        if (s == MAP_EMPTY || s > addr || (found && m->s[j] >= best)) continue;
        int64_t size = m->v[j];
        if (sizes_in_bs) {
            int64_t ref = size >= 0 ? size : ~size;
            if (ref >= c->bs_len) {
                PyErr_SetString(PyExc_IndexError, "list index out of range");
                return -1;
            }
            size = c->bs[ref];
        }
        if (addr < s + size) {
            found = 1;
            best = m->s[j];
            *out = s;
        }
    }
    return found;
}

static int c_overlaps(RecCore *c, int64_t start, int64_t size) {
    size_t j = vec_bisect_right(&c->starts, start);
    if (j > 0) {
        int64_t s = c->starts.v[j - 1], ss;
        if (!map_get(&c->seg_size, s, &ss)) return key_error(s);
        if (s + ss > start) return 1;
    }
    return j < c->starts.len && c->starts.v[j] < start + size;
}

static int c_round(RecCore *c, int64_t sz, int64_t *r) {
    if (c->plain) {
        *r = sz >= c->min_block ? (sz + c->min_block - 1) & -c->min_block : c->min_block;
        return 0;
    }
    PyObject *so = PyLong_FromLongLong(sz);
    PyObject *ro = so ? PyObject_CallOneArg(c->round_size, so) : NULL;
    Py_XDECREF(so);
    if (!ro) return -1;
    int rc = as_i64(ro, r);
    Py_DECREF(ro);
    return rc;
}

static inline int c_splits(const RecCore *c, int64_t rem, int64_t r) {
    return r <= c->small ? ((i128)rem > c->over_s && (i128)r < c->below_s)
                         : ((i128)rem > c->over_l && (i128)r < c->below_l);
}

/* register a meta tuple (stream, pool, segment_type, is_expandable, stack) -> its index */
static int64_t c_meta(RecCore *c, PyObject *meta) {
    int64_t stream, pool;
    PyObject *s = PySequence_GetItem(meta, 0), *p = s ? PySequence_GetItem(meta, 1) : NULL;
    PyObject *t = p ? PySequence_GetItem(meta, 2) : NULL;
    PyObject *e = t ? PySequence_GetItem(meta, 3) : NULL;
    int rc = e ? 0 : -1, exp = 0, large = 0;
    if (rc == 0) rc = as_i64(s, &stream);
    if (rc == 0) rc = as_i64(p, &pool);
    if (rc == 0 && (exp = PyObject_IsTrue(e)) < 0) rc = -1;
    if (rc == 0) large = PyUnicode_Check(t) && PyUnicode_CompareWithASCIIString(t, "large") == 0;
    Py_XDECREF(s);
    Py_XDECREF(p);
    Py_XDECREF(t);
    Py_XDECREF(e);
    if (rc < 0 || PyList_Append(c->metas, meta) < 0) return -1;
    if (vec_push(&c->m_stream, stream) < 0 || vec_push(&c->m_pool, pool) < 0 || vec_push(&c->m_exp, exp) < 0 ||
        vec_push(&c->m_large, large) < 0)
        return -1;
    return (int64_t)c->m_exp.len - 1;
}

/* rep._meta_of_event(i, size, expandable), registered */
static int64_t c_meta_of_event(RecCore *c, int64_t i, int64_t size, int expandable) {
    PyObject *m = PyObject_CallMethod(c->rep, "_meta_of_event", "LLO", (long long)i, (long long)size,
                                      expandable ? Py_True : Py_False);
    if (!m) return -1;
    int64_t k = c_meta(c, m);
    Py_DECREF(m);
    return k;
}

static int c_alloc_slow(RecCore *c, int64_t i, int64_t ad, int64_t req) {
    int64_t r, fs = 0, us = 0, f, b; /* fs, us: set by c_containing where it finds one (the compiler cannot see it) */
    if (c_issue(c, i, "alloc-outside-free", "alloc at an address where no free block starts") < 0 ||
        c_round(c, req, &r) < 0)
        return -1;
    int found = c_containing(c, &c->free_sz, 0, ad, &fs);
    if (found < 0) return -1;
    if (!found) {
        found = c_containing(c, &c->used, 1, ad, &us);
        if (found < 0) return -1;
        if (!found) { /* outside every known segment: keep the block, attached to nothing */
            if (map_set(&c->used, ad, i) < 0) return -1;
            c->bs[i] = r;
            return 0;
        }
        int64_t raw = 0, ref;
        map_get(&c->used, us, &raw);
        ref = raw >= 0 ? raw : ~raw;
        int64_t cut = us + c->bs[ref] - ad;
        c->bs[ref] -= cut;
        if (ref >= c->n) { /* a block from before the trace: the initial figures hold its old size */
            if (vec_push(&c->ac_i, i) < 0 || vec_push(&c->ac_v, -cut) < 0) return -1;
            if (raw >= 0 && (vec_push(&c->aa_i, i) < 0 || vec_push(&c->aa_v, -cut) < 0)) return -1;
        }
        if (c_add_free(c, ad, cut) < 0) return -1;
    } else {
        int64_t total;
        if (c_remove_free(c, fs, &total) < 0 || c_add_free(c, fs, ad - fs) < 0 ||
            c_add_free(c, ad, fs + total - ad) < 0)
            return -1;
    }
    if (c_remove_free(c, ad, &f) < 0) return -1;
    b = f;
    if (f > r && c_splits(c, f - r, r)) {
        if (c_add_free(c, ad + r, f - r) < 0) return -1;
        b = r;
    }
    if (map_set(&c->used, ad, i) < 0) return -1;
    c->bs[i] = b;
    return 0;
}

static int c_segment_alloc(RecCore *c, int64_t i, int64_t ad, int64_t sz) {
    int ov = c_overlaps(c, ad, sz);
    if (ov < 0) return -1;
    if (ov) return c_ignore(c, i, "segment-overlap", "segment_alloc over a known segment");
    int64_t meta = c_meta_of_event(c, i, sz, 0);
    if (meta < 0 || c_add_segment(c, ad, sz, meta) < 0) return -1;
    return c_add_free(c, ad, sz);
}

static int c_segment_free(RecCore *c, int64_t i, int64_t ad, int64_t sz) {
    int64_t s, f, meta;
    if (!map_get(&c->seg_size, ad, &s) || s != sz || !map_get(&c->free_sz, ad, &f) || f != sz)
        return c_ignore(c, i, "unknown-segment", "segment_free of a segment not known whole and free");
    return c_remove_free(c, ad, NULL) < 0 || c_drop_segment(c, ad, &meta) < 0 ? -1 : 0;
}

/* meta[3] and meta[0] == stream and (pool == 0 or meta[1] == pool) */
static int same_reservation(RecCore *c, int64_t meta, int64_t stream, int64_t pool) {
    return c->m_exp.v[meta] && c->m_stream.v[meta] == stream && (pool == 0 || c->m_pool.v[meta] == pool);
}

static int item_i64(PyObject *column, int64_t i, int64_t *out) {
    PyObject *o = PySequence_GetItem(column, (Py_ssize_t)i);
    if (!o) return -1;
    int rc = as_i64(o, out);
    Py_DECREF(o);
    return rc;
}

static int c_segment_map(RecCore *c, int64_t i, int64_t ad, int64_t sz) {
    int64_t end = ad + sz, stream, pool, start = ad, stop = end, meta = -1, prev, pmeta, nsize, nmeta, ps, lo, hi;
    int ov = c_overlaps(c, ad, sz);
    if (ov < 0) return -1;
    if (ov) return c_ignore(c, i, "segment-overlap", "segment_map over a mapped range");
    if (item_i64(c->stream, i, &stream) < 0 || item_i64(c->pool, i, &pool) < 0) return -1;
    /* Mapped ranges of one reservation that touch become one segment. */
    if (map_get(&c->seg_end, ad, &prev)) {
        if (c_meta_of_start(c, prev, &pmeta) < 0) return -1;
        if (same_reservation(c, pmeta, stream, pool)) {
            if (c_drop_segment(c, prev, &meta) < 0) return -1;
            start = prev;
        }
    }
    if (map_get(&c->seg_size, end, &nsize)) {
        if (c_meta_of_start(c, end, &nmeta) < 0) return -1;
        if (same_reservation(c, nmeta, stream, pool)) {
            int64_t dropped;
            stop = end + nsize;
            if (c_drop_segment(c, end, &dropped) < 0) return -1;
            if (meta < 0) meta = nmeta;
        }
    }
    if (meta < 0 && (meta = c_meta_of_event(c, i, sz, 1)) < 0) return -1;
    if (c_add_segment(c, start, stop - start, meta) < 0) return -1;
    lo = ad;
    hi = end;
    if (start < ad && map_get(&c->free_end, ad, &ps)) {
        if (c_remove_free(c, ps, NULL) < 0) return -1;
        lo = ps;
    }
    if (end < stop && map_find(&c->free_sz, end) >= 0) {
        int64_t got;
        if (c_remove_free(c, end, &got) < 0) return -1;
        hi = end + got;
    }
    return c_add_free(c, lo, hi - lo);
}

static int c_segment_unmap(RecCore *c, int64_t i, int64_t ad, int64_t sz) {
    int64_t end = ad + sz, fs = 0, seg = 0, fsize = 0, ssize = 0, meta = 0, got, fe, seg_stop;
    int hasf = c_containing(c, &c->free_sz, 0, ad, &fs);
    if (hasf < 0) return -1;
    int hass = c_segment_of(c, ad, &seg);
    if (hass < 0) return -1;
    int bad = !hasf || (map_get(&c->free_sz, fs, &fsize), fs + fsize < end) || !hass;
    if (!bad) {
        if (c_meta_of_start(c, seg, &meta) < 0) return -1;
        bad = !c->m_exp.v[meta];
    }
    if (!bad) {
        if (!map_get(&c->seg_size, seg, &ssize)) return key_error(seg);
        bad = seg + ssize < end;
    }
    if (bad) return c_ignore(c, i, "unknown-segment", "segment_unmap outside a free mapped block");
    if (c_remove_free(c, fs, &got) < 0) return -1;
    fe = fs + got;
    if (!map_get(&c->seg_size, seg, &ssize)) return key_error(seg);
    seg_stop = seg + ssize;
    if (c_drop_segment(c, seg, &meta) < 0) return -1;
    if (seg < ad && c_add_segment(c, seg, ad - seg, meta) < 0) return -1;
    if (end < seg_stop && c_add_segment(c, end, seg_stop - end, meta) < 0) return -1;
    if (fs < ad && c_add_free(c, fs, ad - fs) < 0) return -1;
    if (end < fe && c_add_free(c, end, fe - end) < 0) return -1;
    return 0;
}

static int c_is_stop(const RecCore *c, int64_t i) {
    size_t j = vec_bisect_left(&c->stops, i);
    return j < c->stops.len && c->stops.v[j] == i;
}

/* one alloc served by the free block at its address (the loop's common case) */
static int c_alloc(RecCore *c, int64_t i, int64_t ad, int64_t sz, int64_t f) {
    int64_t r;
    if (c_round(c, sz, &r) < 0) return -1;
    int64_t rem = f - r;
    if (f >= c->tmin) {
        int emptied;
        if (c_count_down(c, f, &emptied) < 0) return -1;
        if (emptied) {
            if (c->dist.len == 1 && c_retrack(c) < 0) return -1;
            if (c_record_largest(c, i) < 0) return -1;
        }
    }
    int cnt = c->cmode == 0;
    if (!cnt && c->cmode == 2 && (cnt = c_counts_split(c, ad)) < 0) return -1;
    if (cnt) {
        int64_t s;
        if (map_get(&c->seg_size, ad, &s) && s == f && (c_ns(c, i, -f) < 0 || c_wf(c, i, ad, -1) < 0))
            return -1; /* a whole segment taken */
    } else if (c_ns(c, i, -f) < 0) {
        return -1;
    }
    if (rem < 0) {
        if (c_issue(c, i, "block-too-small", "alloc larger than the free block") < 0) return -1;
        rem = 0;
    }
    if (c_splits(c, rem, r)) {
        if (c_track_free(c, ad + r, rem, i) < 0) return -1; /* ends at ad + f, the old block's end */
        if (!cnt && c_ns(c, i, rem) < 0) return -1;
        c->bs[i] = r;
    } else {
        if (!map_pop(&c->free_end, ad + f, NULL)) return key_error(ad + f);
        c->bs[i] = f;
    }
    return map_set(&c->used, ad, i);
}

/* a block freed (completed, or fused with its request: then j = i + 1) and merged with its free neighbours */
static int c_free(RecCore *c, int64_t i, int64_t ad, int fused) {
    int64_t ref = 0, j, b;
    int had = map_pop(&c->used, ad, &ref);
    if (fused) {
        j = i + 1;
        if (!had || ref < 0) {
            c_raise(c, i, "free of an address with no allocated block");
            return -1;
        }
        b = c->bs[ref];
        c->bs[i] = b; /* the request's figure: the Python loop copies it after the pass */
    } else {
        j = i;
        if (!had) return c_ignore(c, i, "unknown-free", "free of an address with no active block");
        if (ref < 0) {
            b = c->bs[~ref];
        } else {
            b = c->bs[ref];
            if (c->strict) {
                if (map_set(&c->used, ad, ref) < 0) return -1;
                c_raise(c, i, "free_completed without free_requested");
                return -1;
            }
            if (c_issue(c, i, "unrequested-free", "free_completed without free_requested") < 0) return -1;
            if (vec_push(&c->aa_i, i) < 0 || vec_push(&c->aa_v, -b) < 0) return -1;
        }
    }
    c->bs[j] = b;
    int cnt = c->cmode == 0;
    if (!cnt && c->cmode == 2 && (cnt = c_counts_split(c, ad)) < 0) return -1;
    int64_t start = ad, end = ad + b, ns, ps, psz;
    int merged_next = 0, merged_prev = 0;
    /* Merge with free neighbours of the same segment: a segment boundary matters only if it is free. The
     * reference pops the merged neighbour's entry at the merged block's far end (free_end[end + ns],
     * free_sz[ps]) and sets the same key at the end: the entry stays, and map_set_last moves it then. */
    if (map_pop(&c->free_sz, end, &ns)) {
        if (map_find(&c->seg_size, end) >= 0) {
            if (map_set(&c->free_sz, end, ns) < 0) return -1;
        } else {
            if (map_find(&c->free_end, end + ns) < 0) return key_error(end + ns);
            int emptied;
            if (ns >= c->tmin && c_count_down(c, ns, &emptied) < 0) return -1;
            end += ns;
            merged_next = 1;
        }
    }
    if (map_pop(&c->free_end, ad, &ps)) {
        if (map_find(&c->seg_size, ad) >= 0) {
            if (map_set(&c->free_end, ad, ps) < 0) return -1;
        } else {
            Py_ssize_t at = map_find(&c->free_sz, ps);
            if (at < 0) return key_error(ps);
            psz = c->free_sz.v[at];
            int emptied;
            if (psz >= c->tmin && c_count_down(c, psz, &emptied) < 0) return -1;
            start = ps;
            merged_prev = 1;
        }
    }
    int64_t m = end - start;
    if ((merged_prev ? map_set_last(&c->free_sz, start, m) : map_set(&c->free_sz, start, m)) < 0 ||
        (merged_next ? map_set_last(&c->free_end, end, start) : map_set(&c->free_end, end, start)) < 0)
        return -1;
    if (m >= c->tmin) {
        int added;
        if (c_count_up(c, m, &added) < 0) return -1;
        if (added) {
            if ((int64_t)c->dist.len > c->tlimit && c_retrack(c) < 0) return -1;
            if (c_record_largest(c, j) < 0) return -1;
        }
    }
    /* Blocks merged into m were split ones: only m itself may change the nonsplit bytes. */
    if (!cnt) return c_ns(c, j, b);
    int64_t s;
    return map_get(&c->seg_size, start, &s) && s == m ? (c_ns(c, j, m) < 0 || c_wf(c, j, start, 1) < 0 ? -1 : 0) : 0;
}

/* -1 with an error once core_columns wrote allocated over the block sizes, which the state's moves read */
static int sizes_kept(const RecCore *c) {
    if (!c->in_place) return 0;
    PyErr_SetString(PyExc_RuntimeError, "recorded core: the block sizes hold the allocated column now");
    return -1;
}

/* _Replayer.run(lo, hi) */
static PyObject *core_run(RecCore *c, PyObject *args) {
    PyObject *rep;
    Py_ssize_t lo, hi;
    if (!PyArg_ParseTuple(args, "Onn", &rep, &lo, &hi) || sizes_kept(c) < 0) return NULL;
    if (lo < 0 || hi > c->n || lo > hi) {
        PyErr_SetString(PyExc_IndexError, "recorded core: run outside the trace");
        return NULL;
    }
    c->rep = rep;
    const unsigned char *act = c->act;
    const int64_t *addr = c->addr, *size = c->size;
    int rc = 0;
    for (Py_ssize_t i = lo; i < hi && rc == 0; i++) {
        long a = act[i];
        int64_t ad = addr[i];
        c->cur = i;
        if (a == c->alloc) {
            int64_t f;
            rc = map_pop(&c->free_sz, ad, &f) ? c_alloc(c, i, ad, size[i], f) : c_alloc_slow(c, i, ad, size[i]);
        } else if (a == c->free_requested) {
            if (c->strict && i + 1 < hi && act[i + 1] == c->free_completed && addr[i + 1] == ad && !c_is_stop(c, i)) {
                rc = c_free(c, i, ad, 1);
                i++;
                continue;
            }
            Py_ssize_t j = map_find(&c->used, ad); /* one probe: the entry is marked pending where it is */
            int64_t ref = j >= 0 ? c->used.v[j] : -1;
            if (ref < 0) {
                rc = c_ignore(c, i, "unknown-free", "free of an address with no allocated block");
            } else {
                c->used.v[j] = ~ref;
                c->bs[i] = c->bs[ref];
            }
        } else if (a == c->free_completed) {
            rc = c_free(c, i, ad, 0);
        } else if (a == c->seg_alloc) {
            rc = c_segment_alloc(c, i, ad, size[i]);
        } else if (a == c->seg_free) {
            rc = c_segment_free(c, i, ad, size[i]);
        } else if (a == c->seg_map) {
            rc = c_segment_map(c, i, ad, size[i]);
        } else if (a == c->seg_unmap) {
            rc = c_segment_unmap(c, i, ad, size[i]);
        }
    }
    c->rep = NULL;
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* -- seeding (the starting state) and views */

static PyObject *core_add_segment(RecCore *c, PyObject *args) {
    long long start, size;
    PyObject *meta;
    if (!PyArg_ParseTuple(args, "LLO", &start, &size, &meta)) return NULL;
    int64_t k = c_meta(c, meta);
    if (k < 0 || c_add_segment(c, start, size, k) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *core_add_free(RecCore *c, PyObject *args) {
    long long start, size;
    if (!PyArg_ParseTuple(args, "LL", &start, &size)) return NULL;
    if (c_add_free(c, start, size) < 0) return NULL;
    Py_RETURN_NONE;
}

/* a live block of the starting state: its ref is the next one (n + len(pre)); stored ~ref if pending */
static PyObject *core_add_used(RecCore *c, PyObject *args) {
    long long addr, size;
    int pending;
    if (!PyArg_ParseTuple(args, "LLp", &addr, &size, &pending) || sizes_kept(c) < 0) return NULL;
    if (c->bs_len == c->bs_cap) {
        Py_ssize_t cap = c->bs_cap * 2 + 16;
        int64_t *bs = PyMem_Realloc(c->bs, (size_t)cap * sizeof(int64_t));
        if (!bs) return PyErr_NoMemory();
        c->bs = bs;
        c->bs_cap = cap;
    }
    int64_t ref = c->bs_len;
    c->bs[c->bs_len++] = size;
    if (map_set(&c->used, addr, pending ? ~ref : ref) < 0) return NULL;
    return PyLong_FromLongLong(ref);
}

static PyObject *core_retrack(RecCore *c, PyObject *unused) {
    if (c_retrack(c) < 0) return NULL;
    Py_RETURN_NONE;
}

/* (blocks, segments): blocks as export() sorts them, (address, size, free, ref); segments (start, size, meta) */
static PyObject *core_blocks(RecCore *c, PyObject *unused) {
    if (sizes_kept(c) < 0) return NULL;
    PyObject *blocks = PyList_New(0), *segs = PyList_New(0), *t;
    if (!blocks || !segs) goto fail;
    for (size_t j = 0; j < c->free_sz.cap; j++) {
        if (c->free_sz.k[j] == MAP_EMPTY) continue;
        t = Py_BuildValue("(LLOi)", (long long)c->free_sz.k[j], (long long)c->free_sz.v[j], Py_True, 0);
        if (!t || PyList_Append(blocks, t) < 0) goto fail_t;
        Py_DECREF(t);
    }
    for (size_t j = 0; j < c->used.cap; j++) {
        if (c->used.k[j] == MAP_EMPTY) continue;
        int64_t ref = c->used.v[j], r = ref >= 0 ? ref : ~ref;
        t = Py_BuildValue("(LLOL)", (long long)c->used.k[j], (long long)c->bs[r], Py_False, (long long)ref);
        if (!t || PyList_Append(blocks, t) < 0) goto fail_t;
        Py_DECREF(t);
    }
    for (size_t j = 0; j < c->seg_size.cap; j++) {
        int64_t s = c->seg_size.k[j], meta;
        if (s == MAP_EMPTY) continue;
        if (c_meta_of_start(c, s, &meta) < 0) goto fail;
        t = Py_BuildValue("(LLO)", (long long)s, (long long)c->seg_size.v[j], PyList_GET_ITEM(c->metas, meta));
        if (!t || PyList_Append(segs, t) < 0) goto fail_t;
        Py_DECREF(t);
    }
    return Py_BuildValue("(NN)", blocks, segs);
fail_t:
    Py_XDECREF(t);
fail:
    Py_XDECREF(blocks);
    Py_XDECREF(segs);
    return NULL;
}

/* a map as a dict in insertion order; pairs (i, v) as a dict of sums */
static PyObject *map_dict(const Map *m) {
    size_t n = m->len, k = 0;
    size_t *order = PyMem_Malloc((n + 1) * sizeof(size_t));
    PyObject *d = PyDict_New();
    if (!order || !d) goto fail;
    for (size_t j = 0; j < m->cap; j++)
        if (m->k[j] != MAP_EMPTY) order[k++] = j;
    for (size_t a = 1; a < n; a++) /* insertion sort by insertion number: test views only */
        for (size_t b = a; b > 0 && m->s[order[b - 1]] > m->s[order[b]]; b--) {
            size_t x = order[b];
            order[b] = order[b - 1];
            order[b - 1] = x;
        }
    for (size_t a = 0; a < n; a++) {
        PyObject *key = PyLong_FromLongLong(m->k[order[a]]), *val = PyLong_FromLongLong(m->v[order[a]]);
        int rc = key && val ? PyDict_SetItem(d, key, val) : -1;
        Py_XDECREF(key);
        Py_XDECREF(val);
        if (rc < 0) goto fail;
    }
    PyMem_Free(order);
    return d;
fail:
    PyMem_Free(order);
    Py_XDECREF(d);
    return NULL;
}

static PyObject *vec_list(const Vec *a, size_t len) {
    PyObject *l = PyList_New((Py_ssize_t)len);
    for (size_t j = 0; l && j < len; j++) {
        PyObject *x = PyLong_FromLongLong(a->v[j]);
        if (!x) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)j, x);
    }
    return l;
}

static PyObject *pairs_dict(const Vec *i, const Vec *v) {
    PyObject *d = PyDict_New();
    for (size_t j = 0; d && j < i->len; j++) {
        PyObject *key = PyLong_FromLongLong(i->v[j]), *old = key ? PyDict_GetItemWithError(d, key) : NULL;
        int64_t sum = v->v[j], prev = 0;
        int rc = key && !PyErr_Occurred() ? 0 : -1;
        if (rc == 0 && old) rc = as_i64(old, &prev);
        PyObject *val = rc == 0 ? PyLong_FromLongLong(prev + sum) : NULL;
        rc = val ? PyDict_SetItem(d, key, val) : -1;
        Py_XDECREF(key);
        Py_XDECREF(val);
        if (rc < 0) Py_CLEAR(d);
    }
    return d;
}

/* the state as the Python replayer's attributes (tests look at them) */
static PyObject *core_internals(RecCore *c, PyObject *unused) {
    if (sizes_kept(c) < 0) return NULL;
    Vec bs = {c->bs, (size_t)c->bs_len, 0};
    return Py_BuildValue("{sNsNsNsNsNsNsNsNsNsNsNsNsNsNsNsNsNsNsLsLsLsL}", "wf_i", vec_list(&c->wf_i, c->wf_i.len),
                         "wf_v", vec_list(&c->wf_v, c->wf_v.len), "free_sz", map_dict(&c->free_sz), "free_end",
                         map_dict(&c->free_end), "used", map_dict(&c->used), "seg_size", map_dict(&c->seg_size),
                         "seg_end", map_dict(&c->seg_end), "fcount", map_dict(&c->fcount), "dist",
                         vec_list(&c->dist, c->dist.len), "starts", vec_list(&c->starts, c->starts.len), "bs",
                         vec_list(&bs, bs.len), "ns_i", vec_list(&c->ns_i, c->ns_i.len), "ns_v",
                         vec_list(&c->ns_v, c->ns_v.len), "lf_i", vec_list(&c->lf_i, c->lf_i.len), "lf_v",
                         vec_list(&c->lf_v, c->lf_v.len), "ignored", vec_list(&c->ignored, c->ignored.len),
                         "adj_alloc", pairs_dict(&c->aa_i, &c->aa_v), "adj_active", pairs_dict(&c->ac_i, &c->ac_v),
                         "tmin", (long long)c->tmin, "tlimit", (long long)c->tlimit, "cmode", (long long)c->cmode,
                         "n_exp", (long long)c->n_exp);
}

/* _Replayer.whole_free(): the records behind RecordedReplay.whole_free_segments, as the bytes of two
 * int64 arrays (events, changes): a trace that fills and empties whole segments makes hundreds of
 * thousands, which as lists of ints cost more than the rest of the replay's hand-over. */
static PyObject *core_whole_free(RecCore *c, PyObject *unused) {
    /* (an empty Vec's NULL would build None) */
    return Py_BuildValue("(y#y#)", c->wf_i.len ? (const char *)c->wf_i.v : "", (Py_ssize_t)(c->wf_i.len * sizeof(int64_t)),
                         c->wf_v.len ? (const char *)c->wf_v.v : "", (Py_ssize_t)(c->wf_v.len * sizeof(int64_t)));
}

/* Whether a buffer taken with PyBUF_FORMAT holds int64 (numpy's format for it is "l" or "q"). */
static inline int is_int64(const Py_buffer *b) {
    return b->itemsize == 8 && b->format && (!strcmp(b->format, "l") || !strcmp(b->format, "q"));
}

static int in_column(PyObject *o, Py_buffer *b, Py_ssize_t n) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (!is_int64(b) || b->len != n * 8) {
        PyBuffer_Release(b);
        PyErr_SetString(PyExc_ValueError, "recorded core: a trace column is not int64 of the trace's length");
        return -1;
    }
    return 0;
}

static int out_column(PyObject *o, Py_buffer *b, Py_ssize_t n) {
    if (PyObject_GetBuffer(o, b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (!is_int64(b) || b->len != n * 8) {
        PyBuffer_Release(b);
        PyErr_SetString(PyExc_ValueError, "recorded core: an output column is not int64 of the trace's length");
        return -1;
    }
    return 0;
}

/* The peaks of allocated, requested and reserved (the first event of each maximum: numpy's argmax),
 * tracked as the columns are written, where three argmax passes read them again. */
#define PEAKS(peak, at, k, a, q, r)                                                                     \
    do {                                                                                                \
        if ((a) > (peak)[0]) (peak)[0] = (a), (at)[0] = (k);                                            \
        if ((q) > (peak)[1]) (peak)[1] = (q), (at)[1] = (k);                                            \
        if ((r) > (peak)[2]) (peak)[2] = (r), (at)[2] = (k);                                            \
    } while (0)

/* Whether a record list's event indices never go down and lie in [lo, n) (lo = INT64_MIN: any below n).
 * One pass records in event order (run() only moves forward, and each event records at itself or,
 * fused, at the next one), so this holds; the scatter below answers where it would not. */
static int records_in_order(const Vec *a, int64_t lo, int64_t n) {
    for (size_t j = 0; j < a->len; j++)
        if (a->v[j] < lo || (lo != INT64_MIN && a->v[j] >= n) || (j && a->v[j] < a->v[j - 1])) return 0;
    return 1;
}

/* core_columns' first form: every event's moves written, the records scattered over them, then summed
 * in place (each column written twice); kept for records out of event order, which no pass makes. */
static void columns_scatter(RecCore *c, int64_t **col, Py_ssize_t n, const long long *init, int64_t *peak,
                            Py_ssize_t *at) {
    /* active's moves go where cached_free will be */
    int64_t *al = col[0], *rq = col[1], *rs = col[2], *ac = col[3], *cf = col[3], *is = col[4], *lf = col[5];
    const int64_t *bs = c->bs, *sz = c->size;
    for (Py_ssize_t k = 0; k < n; k++) { /* each event's moves */
        long a = c->act[k];
        int64_t x = k < c->bs_len ? bs[k] : 0, s = sz[k];
        al[k] = a == c->alloc ? x : (a == c->free_requested ? -x : 0);
        ac[k] = a == c->alloc ? x : (a == c->free_completed ? -x : 0);
        rq[k] = a == c->alloc ? s : (a == c->free_completed ? -s : 0);
        rs[k] = (a == c->seg_alloc || a == c->seg_map) ? s : ((a == c->seg_free || a == c->seg_unmap) ? -s : 0);
        is[k] = 0;
        lf[k] = 0;
    }
    for (size_t j = 0; j < c->ignored.len; j++) rq[c->ignored.v[j]] = rs[c->ignored.v[j]] = 0;
    for (size_t j = 0; j < c->aa_i.len; j++) al[c->aa_i.v[j]] += c->aa_v.v[j];
    for (size_t j = 0; j < c->ac_i.len; j++) ac[c->ac_i.v[j]] += c->ac_v.v[j];
    for (size_t j = 0; j < c->ns_i.len; j++) is[c->ns_i.v[j]] += c->ns_v.v[j];
    /* largest_free takes lf_v[k] from event lf_i[k] on, the last record of an event winning (_step_column) */
    for (size_t j = 0; j < c->lf_i.len; j++) {
        int64_t ev = c->lf_i.v[j];
        if (ev >= 0 && ev < n && (j + 1 == c->lf_i.len || c->lf_i.v[j + 1] != ev)) lf[ev] = (int64_t)j + 1;
    }
    int64_t sa = init[0], sq = init[1], sr = init[2], sc = init[3], sn = init[4], src = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        al[k] = sa += al[k];
        rq[k] = sq += rq[k];
        rs[k] = sr += rs[k];
        sc += ac[k];
        sn += is[k];
        cf[k] = sr - sc;
        is[k] = cf[k] - sn;
        if (lf[k] > src) src = lf[k];
        lf[k] = src ? c->lf_v.v[src - 1] : init[5];
        PEAKS(peak, at, k, sa, sq, sr);
    }
}

/* the event of record p of a list walked in order (past its end: no event) */
static inline int64_t next_at(const Vec *a, size_t p) { return p < a->len ? a->v[p] : INT64_MAX; }

/* the first event any of the five record lists names next */
static inline int64_t first_of(int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) {
    int64_t m = a < b ? a : b;
    if (c < m) m = c;
    if (d < m) m = d;
    return e < m ? e : m;
}

/* core_columns keeps where its walk stands before every CP_EVERY-th event, so that core_columns_at reaches any
 * event in fewer than CP_EVERY events' steps: the running sums of requested, active and nonsplit, the
 * largest free block, and its place in the four record lists it reads (ignored, active's adjustments,
 * nonsplit's, largest_free's), one cache line (2.4 MB for the 460 MB trace's 2.4M events): a binary search
 * of each list at every point asked for cost more than the walk. */
#define CP_SHIFT 6
#define CP_EVERY ((Py_ssize_t)1 << CP_SHIFT)
#define CP_WIDTH 8

/* The block size of alloc or completion k once allocated is written over the block sizes (in_place): its
 * record in xs where one was kept (*px: the next record from k on), else an alloc's from allocated's step at
 * k, a completion's from its request's step at k - 1 (core_columns kept a record wherever these differ). */
static inline int64_t block_size_at(const RecCore *c, int64_t k, long a, size_t *px) {
    if (*px < c->xs_i.len && c->xs_i.v[*px] == k) return c->xs_v.v[(*px)++];
    const int64_t *al = c->bs;
    return a == c->alloc ? al[k] - al[k - 1] : al[k - 2] - al[k - 1];
}

/* core_columns' one pass, its records in event order: every running sum, the peaks and the checkpoints; of the
 * columns, allocated and reserved written where `two`, the other four where `four`; `keep`: allocated goes
 * over the block sizes, the sizes its steps will not give kept in xs; `derive`: the sizes are gone, taken
 * from allocated and xs (block_size_at). Constants where it is inlined: each form its own loop, no test per
 * event. -1: no memory for xs. */
static inline __attribute__((always_inline)) int columns_pass(RecCore *c, int64_t **col, const long long *init,
                                                              int64_t *peak, Py_ssize_t *at, const int two,
                                                              const int four, const int keep, const int derive) {
    int64_t *al = col[0], *rq = col[1], *rs = col[2], *cf = col[3], *is = col[4], *lf = col[5], *cp = c->cp;
    const int64_t *bs = c->bs, *sz = c->size;
    const unsigned char *act = c->act;
    const long A = c->alloc, FR = c->free_requested, FC = c->free_completed;
    const long SA = c->seg_alloc, SM = c->seg_map, SF = c->seg_free, SU = c->seg_unmap;
    const Py_ssize_t n = c->n;
    int64_t sa = init[0], sq = init[1], sr = init[2], sc = init[3], sn = init[4], lv = init[5];
    int64_t pk[3] = {INT64_MIN, INT64_MIN, INT64_MIN}; /* the loop's own: no column store aliases them */
    Py_ssize_t pat[3] = {-1, -1, -1};
    size_t pi = 0, pa = 0, pc = 0, pn = 0, pl = 0, px = 0;
    int64_t xprev = 0;
    int aaprev = 0; /* whether event k - 1 had adjustments of allocated */
    while (pl < c->lf_i.len && c->lf_i.v[pl] < 0) pl++; /* records of the seeding: the initial figure holds them */
    int64_t ni = next_at(&c->ignored, pi), na = next_at(&c->aa_i, pa), nc = next_at(&c->ac_i, pc);
    int64_t nn = next_at(&c->ns_i, pn), nl = next_at(&c->lf_i, pl);
    int64_t next = first_of(ni, na, nc, nn, nl); /* the first event any record names */
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!(k & (CP_EVERY - 1))) {
            int64_t *q = cp + CP_WIDTH * (k >> CP_SHIFT);
            q[0] = sq, q[1] = sc, q[2] = sn, q[3] = lv;
            q[4] = (int64_t)pi, q[5] = (int64_t)pc, q[6] = (int64_t)pn, q[7] = (int64_t)pl;
        }
        long a = act[k];
        int64_t x = derive ? (a == A || a == FC ? block_size_at(c, k, a, &px) : 0) : bs[k], s = sz[k];
        int64_t dal = a == A ? x : (a == FR ? -x : 0);
        int64_t dac = a == A ? x : (a == FC ? -x : 0);
        int64_t drq = a == A ? s : (a == FC ? -s : 0);
        int64_t drs = (a == SA || a == SM) ? s : ((a == SF || a == SU) ? -s : 0);
        int aahere = 0;
        if (k == next) { /* rare: an event with records */
            if (ni == k) {
                drq = drs = 0;
                while (ni == k) ni = next_at(&c->ignored, ++pi);
            }
            for (; na == k; na = next_at(&c->aa_i, ++pa)) dal += c->aa_v.v[pa], aahere = 1;
            for (; nc == k; nc = next_at(&c->ac_i, ++pc)) dac += c->ac_v.v[pc];
            for (; nn == k; nn = next_at(&c->ns_i, ++pn)) sn += c->ns_v.v[pn];
            for (; nl == k; nl = next_at(&c->lf_i, ++pl)) lv = c->lf_v.v[pl]; /* the last record wins */
            next = first_of(ni, na, nc, nn, nl);
        }
        if (keep) { /* (a strict pass's completion follows its request, at the same size: no record) */
            if ((a == A && (k < 1 || aahere)) ||
                (a == FC && (k < 2 || act[k - 1] != FR || xprev != x || aaprev)))
                if (vec_push(&c->xs_i, k) < 0 || vec_push(&c->xs_v, x) < 0) return -1;
            xprev = x;
            aaprev = aahere;
        }
        sa += dal;
        sq += drq;
        sr += drs;
        sc += dac;
        if (two) al[k] = sa, rs[k] = sr; /* bs[k], read above, is read no more where al is bs */
        if (four) rq[k] = sq, cf[k] = sr - sc, is[k] = sr - sc - sn, lf[k] = lv;
        PEAKS(pk, pat, k, sa, sq, sr);
    }
    for (int j = 0; j < 3; j++) peak[j] = pk[j], at[j] = pat[j];
    return 0;
}

/* _columns and _finished's sums: six per-event columns, written into the int64 arrays given (active, which
 * no report reads, is left to RecordedReplay.active: reserved - cached_free).
 * columns(allocated, requested, reserved, cached_free, inactive_split, largest_free, initial) with
 * initial = (allocated, requested, reserved, active, nonsplit, largest_free) before the first event; None in
 * place of allocated and reserved, or of the other four, writes those not (the report reads the four at a few
 * events only: core_columns_at, from this pass's checkpoints). True in place of allocated writes it over the
 * block sizes (see in_place), once, and the core's buffer is the column then.
 * Returns the peaks of allocated, requested and reserved: ((value, event), ...), event -1 on an empty trace.
 * One pass writes each column once, running sums and all: the records (ignored events, the
 * adjustments, the nonsplit moves and the largest free sizes) are walked beside it, each list in event
 * order. The columns are fresh memory: a second pass over them (moves, then sums) cost as much again
 * in memory traffic as the sums themselves. */
static PyObject *core_columns(RecCore *c, PyObject *args) {
    PyObject *o[6];
    long long init[6];
    int scatter = 0; /* the scatter form asked for by name: the tests hold it to the one pass, which no trace leaves */
    if (!PyArg_ParseTuple(args, "OOOOOO(LLLLLL)|p", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &init[0], &init[1],
                          &init[2], &init[3], &init[4], &init[5], &scatter))
        return NULL;
    /* allocated True: written over the block sizes (the scatter form: into al_own), exported by the core */
    const int two = o[0] != Py_None, four = o[1] != Py_None, own = o[0] == Py_True;
    if ((o[2] != Py_None) != two || (o[3] != Py_None) != four || (o[4] != Py_None) != four ||
        (o[5] != Py_None) != four || !(two || four)) {
        PyErr_SetString(PyExc_ValueError, "recorded core: columns() takes allocated and reserved, the other four, or all six");
        return NULL;
    }
    Py_buffer b[6];
    int64_t *col[6] = {NULL}, *scratch[6] = {NULL};
    int held[6] = {0};
    Py_ssize_t n = c->n;
    PyObject *out = NULL;
    if (c->in_place < 0 || (two && (c->in_place || c->al_own))) {
        PyErr_SetString(PyExc_RuntimeError, "recorded core: allocated is written once, over the block sizes");
        return NULL;
    }
    for (int k = 0; k < 6; k++) {
        if (o[k] == Py_None || (k == 0 && own)) continue;
        if (out_column(o[k], &b[k], n) < 0) goto done;
        held[k] = 1;
        col[k] = b[k].buf;
    }
    int64_t peak[3] = {INT64_MIN, INT64_MIN, INT64_MIN};
    Py_ssize_t at[3] = {-1, -1, -1};
    if (!c->cp && !(c->cp = PyMem_Malloc((size_t)(CP_WIDTH * ((n >> CP_SHIFT) + 1)) * sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    if (scatter || c->bs_len < n || !records_in_order(&c->ignored, 0, n) || !records_in_order(&c->aa_i, 0, n) ||
        !records_in_order(&c->ac_i, 0, n) || !records_in_order(&c->ns_i, 0, n) ||
        !records_in_order(&c->lf_i, INT64_MIN, n)) {
        if (c->in_place) { /* (no pass left records out of order: the sizes are gone, and the tests' scatter
                            * form over them is the one pass's) */
            columns_pass(c, col, init, peak, at, 0, 1, 0, 1);
            goto built;
        }
        if (own && !(col[0] = c->al_own = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t)))) goto nomem;
        for (int k = 0; k < 6; k++) /* the scatter form sums in its columns: those not kept are its scratch */
            if (!col[k] && !(col[k] = scratch[k] = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t)))) {
                PyErr_NoMemory();
                goto done;
            }
        columns_scatter(c, col, n, init, peak, at);
        PyMem_Free(c->cp); /* no checkpoints: these records answer no event but by whole columns */
        c->cp = NULL;
    } else if (own && n) {
        col[0] = c->bs;
        c->in_place = -1; /* until the pass is whole: a failed one lost sizes that xs does not hold */
        if ((four ? columns_pass(c, col, init, peak, at, 1, 1, 1, 0) : columns_pass(c, col, init, peak, at, 1, 0, 1, 0)) < 0)
            goto nomem;
        c->in_place = 1;
    } else {
        if (own && !(col[0] = c->al_own = PyMem_Malloc(sizeof(int64_t)))) goto nomem; /* an empty trace's */
        if (two && four)
            columns_pass(c, col, init, peak, at, 1, 1, 0, 0);
        else if (two)
            columns_pass(c, col, init, peak, at, 1, 0, 0, 0);
        else if (c->in_place)
            columns_pass(c, col, init, peak, at, 0, 1, 0, 1);
        else
            columns_pass(c, col, init, peak, at, 0, 1, 0, 0);
    }
built:
    out = Py_BuildValue("((Ln)(Ln)(Ln))", (long long)peak[0], at[0], (long long)peak[1], at[1], (long long)peak[2],
                        at[2]);
done:
    for (int k = 0; k < 6; k++) {
        if (held[k]) PyBuffer_Release(&b[k]);
        PyMem_Free(scratch[k]);
    }
    return out;
nomem:
    PyErr_NoMemory();
    goto done;
}

/* columns_at(points, reserved, requested, cached_free, inactive_split, largest_free): the four columns that
 * core_columns writes beside allocated and reserved, at the events `points` (int64, each in [0, n), best in
 * increasing order), into the int64 arrays given (one entry a point), without writing them whole: each point
 * is reached from the one before where that is nearer than core_columns' checkpoint before it, else from that
 * checkpoint, walking the same sums and records. `reserved`: the reserved column core_columns wrote.
 * Returns True, or False where core_columns kept no checkpoints (not run, or its records out of event order,
 * which no pass makes: then only the whole columns answer). */
static PyObject *core_columns_at(RecCore *c, PyObject *args) {
    PyObject *o[6];
    if (!PyArg_ParseTuple(args, "OOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5])) return NULL;
    if (!c->cp) Py_RETURN_FALSE;
    if (c->in_place < 0) return PyErr_Format(PyExc_RuntimeError, "recorded core: the block sizes are lost");
    Py_buffer b[6];
    int held = 0;
    PyObject *out = NULL;
    const Py_ssize_t n = c->n;
    if (PyObject_GetBuffer(o[0], &b[0], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    held = 1;
    Py_ssize_t m = b[0].len / 8;
    if (!is_int64(&b[0])) {
        PyErr_SetString(PyExc_ValueError, "recorded core: columns_at's points are not int64");
        goto done;
    }
    if (in_column(o[1], &b[1], n) < 0) goto done;
    held = 2;
    for (; held < 6; held++)
        if (out_column(o[held], &b[held], m) < 0) goto done;
    const int64_t *pts = b[0].buf, *rs = b[1].buf, *bs = c->bs, *sz = c->size;
    int64_t *rq = b[2].buf, *cf = b[3].buf, *is = b[4].buf, *lf = b[5].buf;
    const unsigned char *act = c->act;
    const long A = c->alloc, FC = c->free_completed;
    const Vec *ign = &c->ignored, *aci = &c->ac_i, *nsi = &c->ns_i, *lfi = &c->lf_i;
    int64_t sq = 0, sc = 0, sn = 0, lv = 0;
    size_t pi = 0, pc = 0, pn = 0, pl = 0, px = 0;
    int64_t ni = 0, nc = 0, nn = 0, nl = 0, next = 0; /* as core_columns': the event each list names next */
    Py_ssize_t cur = -1; /* the next event to walk; -1: none walked yet */
    for (Py_ssize_t j = 0; j < m; j++) {
        int64_t p = pts[j];
        if (p < 0 || p >= n) {
            PyErr_Format(PyExc_IndexError, "recorded core: event %lld outside [0, %zd)", (long long)p, n);
            goto done;
        }
        Py_ssize_t base = (Py_ssize_t)p & ~(CP_EVERY - 1);
        if (cur < 0 || p + 1 < cur || base > cur) { /* from the checkpoint before p */
            const int64_t *q = c->cp + CP_WIDTH * (base >> CP_SHIFT);
            sq = q[0], sc = q[1], sn = q[2], lv = q[3];
            pi = (size_t)q[4], pc = (size_t)q[5], pn = (size_t)q[6], pl = (size_t)q[7];
            ni = next_at(ign, pi), nc = next_at(aci, pc), nn = next_at(nsi, pn), nl = next_at(lfi, pl);
            next = first_of(ni, nc, nn, nl, INT64_MAX);
            px = vec_bisect_left(&c->xs_i, base);
            cur = base;
        }
        for (; cur <= p; cur++) { /* core_columns' steps of requested, active, nonsplit and largest_free */
            long a = act[cur];
            int64_t x = !c->in_place ? bs[cur] : (a == A || a == FC ? block_size_at(c, cur, a, &px) : 0), s = sz[cur];
            int64_t dac = a == A ? x : (a == FC ? -x : 0);
            int64_t drq = a == A ? s : (a == FC ? -s : 0);
            if (cur == next) {
                for (; ni == cur; ni = next_at(ign, ++pi)) drq = 0;
                for (; nc == cur; nc = next_at(aci, ++pc)) dac += c->ac_v.v[pc];
                for (; nn == cur; nn = next_at(nsi, ++pn)) sn += c->ns_v.v[pn];
                for (; nl == cur; nl = next_at(lfi, ++pl)) lv = c->lf_v.v[pl];
                next = first_of(ni, nc, nn, nl, INT64_MAX);
            }
            sq += drq;
            sc += dac;
        }
        rq[j] = sq, cf[j] = rs[p] - sc, is[j] = rs[p] - sc - sn, lf[j] = lv;
    }
    out = Py_NewRef(Py_True);
done:
    for (int k = 0; k < held; k++) PyBuffer_Release(&b[k]);
    return out;
}

static PyMethodDef core_methods[] = {
    {"run", (PyCFunction)core_run, METH_VARARGS, "run(replayer, lo, hi): apply events [lo, hi)"},
    {"add_segment", (PyCFunction)core_add_segment, METH_VARARGS, "_add_segment(start, size, meta)"},
    {"add_free", (PyCFunction)core_add_free, METH_VARARGS, "_add_free(start, size)"},
    {"add_used", (PyCFunction)core_add_used, METH_VARARGS, "add_used(addr, size, pending) -> ref"},
    {"retrack", (PyCFunction)core_retrack, METH_NOARGS, "_retrack()"},
    {"blocks", (PyCFunction)core_blocks, METH_NOARGS, "(blocks, segments) for export()"},
    {"internals", (PyCFunction)core_internals, METH_NOARGS, "the state as the Python replayer's attributes"},
    {"whole_free", (PyCFunction)core_whole_free, METH_NOARGS, "the (events, changes) of whole free GC-able segments, int64 bytes"},
    {"columns", (PyCFunction)core_columns, METH_VARARGS, "the per-event columns, into int64 arrays (allocated True: the core's buffer); their peaks"},
    {"columns_at", (PyCFunction)core_columns_at, METH_VARARGS, "requested, cached_free, inactive_split, largest_free at some events"},
    {NULL, NULL, 0, NULL},
};

/* the allocated column core_columns(True, ...) wrote (over the block sizes, or in al_own): the array made on
 * it keeps the core */
static int core_getbuffer(RecCore *c, Py_buffer *view, int flags) {
    int64_t *al = c->in_place > 0 ? c->bs : c->al_own;
    if (!al) {
        view->obj = NULL;
        PyErr_SetString(PyExc_BufferError, "recorded core: no allocated column written");
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)c, al, c->n * (Py_ssize_t)sizeof(int64_t), 0, flags);
}

static PyBufferProcs core_as_buffer = {(getbufferproc)core_getbuffer, NULL};

static PyTypeObject RecCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "analysis.allocator._replaycore.RecordedCore",
    .tp_basicsize = sizeof(RecCore),
    .tp_dealloc = (destructor)core_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The recorded replay's state (replayer._Replayer's, in C).",
    .tp_methods = core_methods,
    .tp_as_buffer = &core_as_buffer,
};

static int core_params(RecCore *c, PyObject *d) {
    const char *names[] = {"alloc", "free_requested", "free_completed", "seg_alloc", "seg_free", "seg_map",
                           "seg_unmap", "plain", "strict", "min_block", "small", "over_s", "below_s",
                           "over_l", "below_l", "round_size", "inconsistent", "track_limit"};
    PyObject *v[18];
    for (int k = 0; k < 18; k++)
        if (!(v[k] = PyDict_GetItemString(d, names[k]))) {
            PyErr_Format(PyExc_KeyError, "recorded_core: parameter %s missing", names[k]);
            return -1;
        }
    long *codes[] = {&c->alloc, &c->free_requested, &c->free_completed, &c->seg_alloc,
                     &c->seg_free, &c->seg_map, &c->seg_unmap};
    for (int k = 0; k < 7; k++) *codes[k] = PyLong_AsLong(v[k]);
    if (PyErr_Occurred()) return -1;
    if ((c->plain = PyObject_IsTrue(v[7])) < 0 || (c->strict = PyObject_IsTrue(v[8])) < 0) return -1;
    if (as_i64(v[9], &c->min_block) < 0 || as_i64(v[10], &c->small) < 0 || as_i128(v[11], &c->over_s) < 0 ||
        as_i128(v[12], &c->below_s) < 0 || as_i128(v[13], &c->over_l) < 0 || as_i128(v[14], &c->below_l) < 0 ||
        as_i64(v[17], &c->track_limit) < 0)
        return -1;
    if (c->min_block <= 0 || (c->min_block & (c->min_block - 1))) {
        PyErr_SetString(PyExc_ValueError, "recorded_core: min_block must be a power of two");
        return -1;
    }
    Py_INCREF(c->round_size = v[15]);
    Py_INCREF(c->inconsistent = v[16]);
    return 0;
}

/* recorded_core(act, addr, size, stream, pool, stops, params): an empty state over one device's trace */
static PyObject *recorded_core(PyObject *self, PyObject *args) {
    PyObject *act, *addr, *size, *stream, *pool, *stops, *pdict;
    if (!PyArg_ParseTuple(args, "O!OOOOOO!", &PyBytes_Type, &act, &addr, &size, &stream, &pool, &stops,
                          &PyDict_Type, &pdict))
        return NULL;
    static int ready = 0;
    if (!ready) {
        if (PyType_Ready(&RecCoreType) < 0) return NULL;
        ready = 1;
    }
    RecCore *c = PyObject_New(RecCore, &RecCoreType);
    if (!c) return NULL;
    memset((char *)c + sizeof(PyObject), 0, sizeof(RecCore) - sizeof(PyObject));
    c->n = PyBytes_GET_SIZE(act);
    Py_INCREF(c->act_o = act);
    c->act = (const unsigned char *)PyBytes_AS_STRING(act);
    Py_INCREF(c->stream = stream);
    Py_INCREF(c->pool = pool);
    if (!(c->metas = PyList_New(0)) || core_params(c, pdict) < 0 || in_column(addr, &c->addr_b, c->n) < 0 ||
        in_column(size, &c->size_b, c->n) < 0)
        goto fail;
    c->addr = c->addr_b.buf;
    c->size = c->size_b.buf;
    Map *maps[] = {&c->free_sz, &c->free_end, &c->used, &c->seg_size, &c->seg_end, &c->seg_meta, &c->fcount};
    for (int k = 0; k < 7; k++)
        if (map_init(maps[k], 64, MAP_SPARSE_LIVE) < 0) goto fail;
    c->bs_cap = c->n + 16;
    c->bs_len = c->n;
    if (!(c->bs = PyMem_Calloc((size_t)c->bs_cap, sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto fail;
    }
    PyObject *it = PyObject_GetIter(stops), *x;
    if (!it) goto fail;
    while ((x = PyIter_Next(it))) {
        int64_t k;
        int rc = as_i64(x, &k);
        Py_DECREF(x);
        if (rc < 0 || vec_insort(&c->stops, k) < 0) break;
    }
    Py_DECREF(it);
    if (PyErr_Occurred() || vec_push(&c->dist, 0) < 0) goto fail;
    c->tlimit = c->track_limit;
    c->cur = -1;
    return (PyObject *)c;
fail:
    Py_DECREF(c);
    return NULL;
}

/* stacks.alloc_lifetimes' pairing (and policy.trace_is_complete's order of allocs and frees), one event at a
 * time, shared by alloc_ends and block_order: each alloc ends at the next event at its address that is an
 * alloc or a free (the pairing's free code), else at the trace's end. Written, where ``start`` is not NULL,
 * per alloc in trace order: its event (``start``), its end (``end``) and how many allocs come before its end
 * (``rank``: outline.live_requested's end_rank, the allocs counted so far where the end is met; every alloc
 * for one live at the end); with the trace's sizes (``size``), also its requested bytes (``bytes``: the
 * lifetimes' size) and the requested bytes live right after it (``after``: outline.live_requested's, each
 * alloc's bytes counted from it up to its end, summed as the events come). ``alternates``: every address
 * starts with an alloc and its kinds alternate. */
typedef struct {
    int64_t *start, *end, *rank, *bytes, *after;
    const int64_t *size;
    uint64_t live; /* unsigned: a hostile trace's sums wrap rather than overflow (the reference's float64 sums
                      are inexact long before) */
    int64_t m, cap, n;
    int alternates;
} Pairing;

/* The pairing's columns in ``out_o`` (None: nothing written): one int64 array of three rows (starts, ends,
 * ranks), one column per alloc, or of five (and bytes, after) where ``size_o`` is the trace's size column
 * (int64, one per event; None: not read). 0 / -1. */
static int pairing_init(Pairing *p, PyObject *out_o, Py_buffer *out, PyObject *size_o, Py_buffer *size, Py_ssize_t n,
                        const char *who) {
    memset(p, 0, sizeof *p);
    p->n = n;
    p->alternates = 1;
    p->cap = INT64_MAX;
    if (out_o == Py_None) return 0;
    if (size_o != Py_None) {
        if (in_column(size_o, size, n) < 0) return -1;
        p->size = size->buf;
    }
    Py_ssize_t rows = p->size ? 5 : 3;
    if (PyObject_GetBuffer(out_o, out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (!is_int64(out) || out->len % (rows * 8)) {
        PyBuffer_Release(out);
        out->obj = NULL;
        PyErr_Format(PyExc_ValueError, "%s: the pairing's columns are not %d int64 rows", who, (int)rows);
        return -1;
    }
    p->cap = (int64_t)(out->len / (rows * 8));
    p->start = out->buf;
    p->end = p->start + p->cap;
    p->rank = p->end + p->cap;
    if (p->size) {
        p->bytes = p->rank + p->cap;
        p->after = p->bytes + p->cap;
    }
    return 0;
}

/* One alloc (``is_alloc``) or free at event ``i``, at an address whose open alloc is ``*open`` (-1: none);
 * ``*open`` becomes the address's open alloc after it. 0 / -1 (more allocs than the columns hold). */
static inline int pair_event(Pairing *p, int64_t *open, int is_alloc, Py_ssize_t i, const char *who) {
    p->alternates &= (*open >= 0) != is_alloc;
    if (*open >= 0 && p->start) {
        p->end[*open] = i;
        p->rank[*open] = p->m;
        if (p->size) p->live -= (uint64_t)p->bytes[*open]; /* its bytes no longer live from its end on */
    }
    if (!is_alloc) {
        *open = -1;
        return 0;
    }
    if (p->m == p->cap) {
        PyErr_Format(PyExc_ValueError, "%s: the pairing's columns are not one per alloc", who);
        return -1;
    }
    if (p->start) {
        p->start[p->m] = i;
        p->end[p->m] = p->n;
        p->rank[p->m] = p->cap;
        if (p->size) {
            p->bytes[p->m] = p->size[i];
            p->live += (uint64_t)p->size[i];
            p->after[p->m] = (int64_t)p->live;
        }
    }
    *open = p->m++;
    return 0;
}

/* Every alloc met: the columns hold one each. 0 / -1. */
static int pairing_done(const Pairing *p, const char *who) {
    if (p->start && p->m != p->cap) {
        PyErr_Format(PyExc_ValueError, "%s: the pairing's columns are not one per alloc", who);
        return -1;
    }
    return 0;
}

/* alloc_ends(act, addr, alloc, free, out, size) -> (allocs, alternates) or None: the pairing (above) in one
 * pass, its columns written into ``out`` (pairing_init; None: not written). The map holds, per address, the
 * alloc it is open for: only the blocks live at a time, so it stays in cache, where the reference's sort
 * by address reads every event several times. None where an address is the map's empty key, which no
 * real address is (``out`` then holds what was written up to it: compiled.alloc_ends drops it). */
static PyObject *alloc_ends(PyObject *self, PyObject *args) {
    PyObject *act_o, *addr_o, *out_o, *size_o;
    long alloc, free_code;
    if (!PyArg_ParseTuple(args, "OOllOO", &act_o, &addr_o, &alloc, &free_code, &out_o, &size_o)) return NULL;
    Py_buffer act, addr, cols = {0}, size = {0};
    if (PyObject_GetBuffer(act_o, &act, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t n = act.len;
    if (act.itemsize != 1) {
        PyBuffer_Release(&act);
        PyErr_SetString(PyExc_ValueError, "alloc_ends: the action column is not one byte per event");
        return NULL;
    }
    if (in_column(addr_o, &addr, n) < 0) {
        PyBuffer_Release(&act);
        return NULL;
    }
    PyObject *out = NULL;
    Map open = {0};
    Pairing p;
    const signed char *a = act.buf;
    const int64_t *ad = addr.buf;
    if (pairing_init(&p, out_o, &cols, size_o, &size, n, "alloc_ends") < 0) goto done;
    if (map_init(&open, 1024, MAP_SPARSE_LIVE) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int is_alloc = a[i] == alloc;
        if (!is_alloc && a[i] != free_code) continue;
        if (ad[i] == MAP_EMPTY) { /* declined where met */
            out = Py_None;
            Py_INCREF(out);
            goto done;
        }
        Py_ssize_t j = map_find(&open, ad[i]);
        int64_t o = j >= 0 ? open.v[j] : -1;
        if (pair_event(&p, &o, is_alloc, i, "alloc_ends") < 0) goto done;
        if (o >= 0) {
            if (j >= 0)
                open.v[j] = o;
            else if (map_set(&open, ad[i], o) < 0) /* the alloc now open at this address */
                goto done;
        } else if (j >= 0) {
            map_del_at(&open, (size_t)j);
        }
    }
    if (pairing_done(&p, "alloc_ends") < 0) goto done;
    out = Py_BuildValue("(LO)", (long long)p.m, p.alternates ? Py_True : Py_False);
done:
    if (open.k) map_free(&open);
    if (cols.obj) PyBuffer_Release(&cols);
    if (size.obj) PyBuffer_Release(&size);
    PyBuffer_Release(&addr);
    PyBuffer_Release(&act);
    return out;
}

static int in_i32(PyObject *o, Py_buffer *b, Py_ssize_t n, const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (b->itemsize != 4 || b->len != n * 4 || !b->format || (strcmp(b->format, "i") && strcmp(b->format, "l"))) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_ValueError, "block_order: the %s column is not int32 of the trace's length", what);
        return -1;
    }
    return 0;
}

/* block_order's map of every address the trace names (the 460 MB trace: 77k) to its slot value: each key beside
 * its value in one 16-byte entry, so that an event's probe and its value share a cache line, where Map's keys
 * and values (two columns of 2 MB each at that size, past L2) cost two misses an event. Linear probing at a
 * load of at most 1/2; ``at`` (the last event, read with ``lanes``) a column of its own, by entry. distinct_count
 * keeps its set of values in one too, the values unused. */
typedef struct {
    int64_t k, v;
} Entry;

typedef struct {
    Entry *e;
    int64_t *at; /* NULL: not kept */
    size_t cap, len;
    int shift;
} AddrMap;

static int am_init(AddrMap *m, size_t cap, int with_at) {
    int bits = 0;
    while (((size_t)1 << bits) < cap) bits++;
    m->cap = cap, m->len = 0, m->shift = 64 - bits;
    m->e = PyMem_Malloc(cap * sizeof(Entry));
    m->at = with_at ? PyMem_Malloc(cap * sizeof(int64_t)) : NULL;
    if (!m->e || (with_at && !m->at)) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t j = 0; j < cap; j++) m->e[j].k = MAP_EMPTY;
    return 0;
}

static void am_free(AddrMap *m) {
    PyMem_Free(m->e);
    PyMem_Free(m->at);
    m->e = NULL, m->at = NULL;
}

/* The entry of ``key``, or the empty one where it would go. */
static inline size_t am_probe(const AddrMap *m, int64_t key) {
    size_t mask = m->cap - 1, j = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> m->shift);
    while (m->e[j].k != key && m->e[j].k != MAP_EMPTY) j = (j + 1) & mask;
    return j;
}

/* Twice the entries, once the table is more than half full. 0 / -1. */
static int am_grow(AddrMap *m) {
    AddrMap old = *m;
    if (am_init(m, old.cap * 2, old.at != NULL) < 0) {
        am_free(m);
        *m = old;
        return -1;
    }
    for (size_t j = 0; j < old.cap; j++) {
        if (old.e[j].k == MAP_EMPTY) continue;
        size_t i = am_probe(m, old.e[j].k);
        m->e[i] = old.e[j];
        if (m->at) m->at[i] = old.at[j];
    }
    m->len = old.len;
    am_free(&old);
    return 0;
}

/* The last block event before ``i`` at ``i``'s address (one is: the map holds it), found by a scan back: only for
 * the pair block_order refuses, since its map keeps each address's last kind and open alloc, not the event. */
static int64_t block_before(const signed char *a, const int64_t *ad, Py_ssize_t i) {
    for (Py_ssize_t k = i - 1; k >= 0; k--)
        if (a[k] >= 0 && a[k] <= 2 && ad[k] == ad[i]) return k;
    return -1;
}

/* block_order(act, addr, stream, pool, next_kind, lanes, alloc, free, out, size) -> (found, alternates) or None: the
 * block events (actions 0..2: alloc, free_requested, free_completed) of eventorder.check_event_order, each
 * against the one before it at its address in trace order; ``found`` is () where every pair is in order,
 * else (cur, prev, kind_wrong). ``next_kind`` (3 bytes, signed) is the action that may follow each kind;
 * with ``lanes`` a free must also keep its alloc's pool and stream. The pass runs in trace order, so the
 * first wrong pair it meets is the one with the earliest ``cur``, the one the reference (a stable sort by
 * address) refuses. The map holds, for every address the trace names (in a caching allocator's trace, few),
 * its last block event's kind and the alloc open there in one value (``(open + 1) << 2 | kind``), and with
 * ``lanes`` that event in the entry's ``at`` (its pool and stream are compared): one int64 read and written
 * per event where the event itself, its kind read back from the action column and the open alloc took
 * three places in memory (the 460 MB trace's 2.4M events: 33 -> 31 ms, alternated), beside its key in one
 * entry (AddrMap: 23 -> 19 ms, the check's three alternated sittings' fastest of 25). A refused pair's
 * earlier event without ``lanes`` is found by a scan back (block_before). None where an address is the
 * map's empty key, met before any wrong pair (the reference answers then).
 * The same pass pairs the allocs as alloc_ends does (``alloc``, ``free``: the pairing's codes, both block
 * actions; ``out``, ``size``: its columns, see pairing_init), so stacks.alloc_lifetimes and
 * policy.trace_is_complete need no second pass by address (``alternates``; the columns are whole only
 * where ``found`` is ()). */
static PyObject *block_order(PyObject *self, PyObject *args) {
    PyObject *act_o, *addr_o, *stream_o, *pool_o, *out_o, *size_o;
    const char *next_kind;
    Py_ssize_t next_len;
    int lanes;
    long alloc, free_code;
    if (!PyArg_ParseTuple(args, "OOOOy#pllOO", &act_o, &addr_o, &stream_o, &pool_o, &next_kind, &next_len, &lanes,
                          &alloc, &free_code, &out_o, &size_o))
        return NULL;
    if (next_len != 3) {
        PyErr_SetString(PyExc_ValueError, "block_order: next_kind is not one byte per block action");
        return NULL;
    }
    if (alloc < 0 || alloc > 2 || free_code < 0 || free_code > 2) {
        PyErr_SetString(PyExc_ValueError, "block_order: the pairing's codes are not block actions");
        return NULL;
    }
    Py_buffer act, addr, stream = {0}, pool = {0}, cols = {0}, size = {0};
    if (PyObject_GetBuffer(act_o, &act, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t n = act.len;
    PyObject *out = NULL;
    AddrMap last = {0};
    Pairing pr;
    if (act.itemsize != 1) {
        PyBuffer_Release(&act);
        PyErr_SetString(PyExc_ValueError, "block_order: the action column is not one byte per event");
        return NULL;
    }
    if (in_column(addr_o, &addr, n) < 0) {
        PyBuffer_Release(&act);
        return NULL;
    }
    if (in_i32(stream_o, &stream, n, "stream") < 0) goto done;
    if (in_i32(pool_o, &pool, n, "pool") < 0) goto done;
    if (pairing_init(&pr, out_o, &cols, size_o, &size, n, "block_order") < 0) goto done;
    const signed char *a = act.buf, *nxt = (const signed char *)next_kind;
    const int64_t *ad = addr.buf;
    const int32_t *st = stream.buf, *pl = pool.buf;
    if (am_init(&last, 1024, lanes) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (a[i] < 0 || a[i] > 2) continue;
        if (ad[i] == MAP_EMPTY) { /* declined where met: every pair before it was in order */
            out = Py_None;
            Py_INCREF(out);
            goto done;
        }
        size_t j = am_probe(&last, ad[i]);
        int64_t open = -1;
        int seen = last.e[j].k == ad[i];
        if (seen) {
            int64_t slot = last.e[j].v;
            int kind_wrong = a[i] != nxt[slot & 3];
            int lane_wrong = lanes && a[i] != 0 && (pl[i] != pl[last.at[j]] || st[i] != st[last.at[j]]);
            if (kind_wrong || lane_wrong) {
                int64_t p = lanes ? last.at[j] : block_before(a, ad, i);
                out = Py_BuildValue("((LLO)O)", (long long)i, (long long)p, kind_wrong ? Py_True : Py_False,
                                    Py_False);
                goto done;
            }
            open = (slot >> 2) - 1;
        }
        if (a[i] == alloc || a[i] == free_code) {
            if (pair_event(&pr, &open, a[i] == alloc, i, "block_order") < 0) goto done;
        }
        last.e[j].v = ((open + 1) << 2) | a[i];
        if (lanes) last.at[j] = i;
        if (!seen) {
            last.e[j].k = ad[i];
            if (++last.len * 2 > last.cap && am_grow(&last) < 0) goto done;
        }
    }
    if (pairing_done(&pr, "block_order") < 0) goto done;
    out = Py_BuildValue("(()O)", pr.alternates ? Py_True : Py_False);
done:
    am_free(&last);
    if (cols.obj) PyBuffer_Release(&cols);
    if (size.obj) PyBuffer_Release(&size);
    if (pool.obj) PyBuffer_Release(&pool);
    if (stream.obj) PyBuffer_Release(&stream);
    PyBuffer_Release(&addr);
    PyBuffer_Release(&act);
    return out;
}

/* request_ops(act, addr, codes, flushes, op) -> requests: requests._stream_of's op column in one pass, where numpy
 * made it in some fifteen passes over the trace's masks. ``codes``: 10 bytes, the actions alloc, free_requested,
 * free_completed and oom, then the ops (requests._OP_*) alloc, free, free_requested, free_completed, oom and
 * flush. Each event's op, -1 for none: an alloc's, an oom's; a free_requested followed at
 * once by its block's free_completed (the same address) is one free, the completion none; another
 * free_requested or free_completed its own op; where the trace has only one kind of free (skip_actions), each
 * is a free. ``flushes``: int64 events whose op becomes a flush (the user's empty_cache() bursts). Returns
 * how many events have an op. */
static PyObject *request_ops(PyObject *self, PyObject *args) {
    PyObject *act_o, *addr_o, *fl_o, *op_o;
    const char *codes;
    Py_ssize_t ncodes;
    if (!PyArg_ParseTuple(args, "OOy#OO", &act_o, &addr_o, &codes, &ncodes, &fl_o, &op_o)) return NULL;
    if (ncodes != 10) return PyErr_Format(PyExc_ValueError, "request_ops: codes is not 10 bytes");
    Py_buffer act, addr = {0}, fl = {0}, op = {0};
    PyObject *out = NULL;
    if (PyObject_GetBuffer(act_o, &act, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t n = act.len;
    if (act.itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "request_ops: the action column is not one byte per event");
        goto done;
    }
    if (in_column(addr_o, &addr, n) < 0) goto done;
    if (PyObject_GetBuffer(fl_o, &fl, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    if (!is_int64(&fl)) {
        PyErr_SetString(PyExc_ValueError, "request_ops: the flushes are not int64");
        goto done;
    }
    if (PyObject_GetBuffer(op_o, &op, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (op.itemsize != 1 || op.len != n) {
        PyErr_SetString(PyExc_ValueError, "request_ops: the op column is not one byte per event");
        goto done;
    }
    const signed char *a = act.buf;
    const int64_t *ad = addr.buf, *f = fl.buf;
    signed char *o = op.buf;
    const signed char A = codes[0], FR = codes[1], FC = codes[2], OOMC = codes[3], OP_A = codes[4], FREE = codes[5],
                      OP_FR = codes[6], OP_FC = codes[7], OP_OOM = codes[8], FLUSH = codes[9];
    int has_fr = memchr(a, FR, (size_t)n) != NULL, has_fc = memchr(a, FC, (size_t)n) != NULL;
    /* each kind's op: a lone free_requested's, a free_completed's that no pair holds */
    const signed char op_fr = has_fc ? OP_FR : FREE, op_fc = has_fr ? OP_FC : FREE;
    signed char tab[256]; /* each action's op, a paired free_requested's apart */
    memset(tab, -1, sizeof tab);
    tab[(unsigned char)A] = OP_A, tab[(unsigned char)FR] = op_fr, tab[(unsigned char)FC] = op_fc;
    tab[(unsigned char)OOMC] = OP_OOM;
    Py_ssize_t m = 0;
    int held = 0; /* the event before was a free_requested paired with this one: no op of its own */
    for (Py_ssize_t i = 0; i < n; i++) {
        signed char x = a[i], v = held ? -1 : tab[(unsigned char)x];
        held = 0;
        if (x == FR && has_fc && i + 1 < n && a[i + 1] == FC && ad[i + 1] == ad[i]) v = FREE, held = 1;
        o[i] = v;
        m += v >= 0;
    }
    Py_ssize_t nf = fl.len / 8;
    for (Py_ssize_t k = 0; k < nf; k++) {
        if (f[k] < 0 || f[k] >= n) {
            PyErr_Format(PyExc_IndexError, "request_ops: flush at event %lld outside the trace", (long long)f[k]);
            goto done;
        }
        m += o[f[k]] < 0;
        o[f[k]] = FLUSH;
    }
    out = PyLong_FromSsize_t(m);
done:
    if (op.obj) PyBuffer_Release(&op);
    if (fl.obj) PyBuffer_Release(&fl);
    if (addr.obj) PyBuffer_Release(&addr);
    PyBuffer_Release(&act);
    return out;
}

/* request_select(op, addr, sel, ops, raddr): the events with an op (request_ops'), in trace order, into
 * ``sel`` (int64), their ops (int8) and recorded addresses (int64), each as long as request_ops' count:
 * numpy's flatnonzero and two gathers, in one pass. */
static PyObject *request_select(PyObject *self, PyObject *args) {
    PyObject *op_o, *addr_o, *sel_o, *ops_o, *ra_o;
    if (!PyArg_ParseTuple(args, "OOOOO", &op_o, &addr_o, &sel_o, &ops_o, &ra_o)) return NULL;
    Py_buffer op, addr = {0}, sel = {0}, ops = {0}, ra = {0};
    PyObject *out = NULL;
    if (PyObject_GetBuffer(op_o, &op, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t n = op.len, m = 0;
    if (op.itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "request_select: the op column is not one byte per event");
        goto done;
    }
    if (in_column(addr_o, &addr, n) < 0) goto done;
    const signed char *o = op.buf;
    for (Py_ssize_t i = 0; i < n; i++) m += o[i] >= 0;
    if (out_column(sel_o, &sel, m) < 0 || out_column(ra_o, &ra, m) < 0) goto done;
    if (PyObject_GetBuffer(ops_o, &ops, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (ops.itemsize != 1 || ops.len != m) {
        PyErr_SetString(PyExc_ValueError, "request_select: the ops column is not one byte per request");
        goto done;
    }
    int64_t *s = sel.buf, *r = ra.buf;
    const int64_t *ad = addr.buf;
    signed char *q = ops.buf;
    Py_ssize_t last = n - 1; /* the last event with an op: up to it every write lands below m */
    while (last >= 0 && o[last] < 0) last--;
    for (Py_ssize_t i = 0, k = 0; i <= last; i++) { /* each event written, kept where it has an op: no branch */
        s[k] = i, q[k] = o[i], r[k] = ad[i];
        k += o[i] >= 0;
    }
    out = Py_NewRef(Py_None);
done:
    if (ra.obj) PyBuffer_Release(&ra);
    if (ops.obj) PyBuffer_Release(&ops);
    if (sel.obj) PyBuffer_Release(&sel);
    if (addr.obj) PyBuffer_Release(&addr);
    PyBuffer_Release(&op);
    return out;
}

/* peak_without(after, end_rank, halves, cut) -> int: workload._peak_without in two passes, where numpy made some
 * ten over the allocations (a masked copy, two gathers, a float64 bincount, two subtractions, a cumsum, a max):
 * the most of ``after[k]`` (the live requested bytes right after allocation k) less the cut bytes gone by then,
 * the ``halves`` of the ``cut`` allocations made up to k less those whose end comes before k (``end_rank``: how
 * many allocations come before each one's end, at most m). Sums in uint64, as exact as the reference's below
 * 2**53 bytes; a hostile trace's wrap rather than overflow. */
static PyObject *peak_without(PyObject *self, PyObject *args) {
    PyObject *o[4];
    if (!PyArg_ParseTuple(args, "OOOO", &o[0], &o[1], &o[2], &o[3])) return NULL;
    Py_buffer b[4];
    int held = 0;
    PyObject *out = NULL;
    uint64_t *ended = NULL;
    if (PyObject_GetBuffer(o[0], &b[0], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    held = 1;
    Py_ssize_t m = b[0].len / 8;
    if (!is_int64(&b[0]) || m < 1) {
        PyErr_SetString(PyExc_ValueError, "peak_without: after is not int64 of one or more allocations");
        goto done;
    }
    for (; held < 3; held++)
        if (in_column(o[held], &b[held], m) < 0) goto done;
    if (PyObject_GetBuffer(o[3], &b[3], PyBUF_C_CONTIGUOUS) < 0) goto done;
    held = 4;
    if (b[3].itemsize != 1 || b[3].len != m) {
        PyErr_SetString(PyExc_ValueError, "peak_without: cut is not one byte per allocation");
        goto done;
    }
    const int64_t *after = b[0].buf, *rank = b[1].buf, *half = b[2].buf;
    const unsigned char *cut = b[3].buf;
    if (!(ended = PyMem_Calloc((size_t)m + 1, sizeof(uint64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        if (!cut[k]) continue;
        if (rank[k] < 0 || rank[k] > m) {
            PyErr_Format(PyExc_IndexError, "peak_without: end rank %lld outside [0, %zd]", (long long)rank[k], m);
            goto done;
        }
        ended[rank[k]] += (uint64_t)half[k];
    }
    uint64_t gone = 0;
    int64_t best = INT64_MIN;
    for (Py_ssize_t k = 0; k < m; k++) {
        gone += (cut[k] ? (uint64_t)half[k] : 0) - ended[k];
        int64_t v = (int64_t)((uint64_t)after[k] - gone);
        best = v > best ? v : best;
    }
    out = PyLong_FromLongLong(best);
done:
    PyMem_Free(ended);
    for (int k = 0; k < held; k++) PyBuffer_Release(&b[k]);
    return out;
}

/* distinct_count(values) -> int: how many distinct values a 1-D int64 array holds (model.sorted_unique's size),
 * by a hash set that grows as they come (block_order's AddrMap): it holds the distinct values alone (the 460 MB
 * trace's 446k large request sizes: 6,730, a table of 256 KB that stays in L2), where the sort took 19-23 ms on
 * this VM (its vectorised quicksort slows on many equal values). */
static PyObject *distinct_count(PyObject *self, PyObject *arg) {
    Py_buffer b;
    PyObject *out = NULL;
    if (PyObject_GetBuffer(arg, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (!is_int64(&b) || b.ndim != 1) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "distinct_count: the values are not a 1-D int64 array");
        return NULL;
    }
    const int64_t *v = b.buf;
    Py_ssize_t n = b.len / 8;
    AddrMap set = {0}; /* block_order's map, its values unused: a key's entry found or made by one probe */
    int empty_seen = 0; /* MAP_EMPTY marks a free entry: that value itself is counted apart */
    if (am_init(&set, 1024, 0) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t x = v[i];
        if (x == MAP_EMPTY) {
            empty_seen = 1;
            continue;
        }
        size_t j = am_probe(&set, x);
        if (set.e[j].k == x) continue;
        set.e[j].k = x;
        if (++set.len * 2 > set.cap && am_grow(&set) < 0) goto done;
    }
    out = PyLong_FromSize_t(set.len + (size_t)empty_seen);
done:
    am_free(&set);
    PyBuffer_Release(&b);
    return out;
}

PyObject *oomscope_policy_engine(PyObject *self, PyObject *args); /* _policycore.c */
PyObject *oomscope_policy_scan(PyObject *self, PyObject *args);   /* _policycore.c */

static PyMethodDef methods[] = {
    {"policy_engine", oomscope_policy_engine, METH_VARARGS, "cachemodel._Model.run on C state (_policycore.c)."},
    {"policy_scan", oomscope_policy_scan, METH_VARARGS, "the checks', the size table's and the frees' pairing pass over policy_engine's requests (_policycore.c)."},
    {"recorded_core", recorded_core, METH_VARARGS, "replayer._Replayer's state and loop (see analysis/allocator/compiled.py)."},
    {"alloc_ends", alloc_ends, METH_VARARGS, "stacks.alloc_lifetimes' pairing of each alloc with its end; whether allocs and frees alternate."},
    {"request_ops", request_ops, METH_VARARGS, "requests._stream_of's op column in one pass."},
    {"request_select", request_select, METH_VARARGS, "the events with an op, their ops and addresses, in one pass."},
    {"peak_without", peak_without, METH_VARARGS, "workload._peak_without's peak of live bytes with the cut allocations halved."},
    {"distinct_count", distinct_count, METH_O, "how many distinct values a 1-D int64 array holds."},
    {"block_order", block_order, METH_VARARGS, "eventorder.check_event_order's block events: the first out of order, in one pass."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_replaycore",
                                       "The allocator model's and the recorded replay's replays on C state.", -1,
                                       methods};

PyMODINIT_FUNC PyInit__replaycore(void) {
    return PyModule_Create(&moduledef);
}
