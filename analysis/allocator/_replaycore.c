/* analysis.allocator._replaycore: the per-event loops of the allocator model and of the recorded replay, in C.
 *
 * Each function here is the hot loop of one Python method, written again statement for
 * statement over the *same* Python objects: the model's free lists (sorted lists of packed
 * ``size << sh | addr`` ints and the blocks beside them), its blocks (5-item lists), its dicts
 * keyed by address; the recorded replay's dicts, size counts and output lists. Everything the
 * loop does not inline is a call back into the Python method (misses, flushes, repairs,
 * segment events), so the state stays the Python one and the reference code runs those
 * paths. No number of the allocator's rules is written here: the Python caller passes each
 * one in, taken from its one definition (analysis/allocator/config.py), as the inlined
 * Python loops take them.
 *
 *   recorded_run(replayer, p_idx, act, addr, size, params)                 (recorded._Replayer.run)
 *   policy_engine(model, params) -> (failed, state, counts)               (policy._Model.run, whole:
 *       on C state, in _policycore.c, compiled into this module; registered below)
 *
 * analysis/allocator/compiled.py decides whether these run; the Python loops stay the reference
 * (tests/analysis/test_replaycore.py compares both on every fixture and on the captures).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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

static PyObject *from_i128(i128 v) {
#if DIGITS_311
    if (v > INT64_MAX) { /* the packed free-list keys: 2 to 4 digits, positive */
        int nd = 0;
        digit d[5];
        for (i128 x = v; x; x >>= PyLong_SHIFT) {
            if (nd == 5) goto generic;
            d[nd++] = (digit)(x & PyLong_MASK);
        }
        PyLongObject *o = _PyLong_New(nd);
        if (!o) return NULL;
        memcpy(o->ob_digit, d, nd * sizeof(digit));
        return (PyObject *)o;
    }
generic:
#endif
    if (v >= INT64_MIN && v <= INT64_MAX) return PyLong_FromLongLong((long long)v);
    unsigned char buf[16];
    memcpy(buf, &v, sizeof buf);
    return _PyLong_FromByteArray(buf, sizeof buf, 1, 1);
}

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

/* A non-negative exact int of at most 4 digits (120 bits) read straight from its digits: 1, or 0 when
 * it is not one (or on an interpreter whose int layout differs: the callers then compare as Python does). */
static inline int fast_u120(PyObject *o, i128 *out) {
#if DIGITS_311
    if (!PyLong_CheckExact(o)) return 0;
    Py_ssize_t nd = Py_SIZE(o);
    if (nd < 0 || nd > 4) return 0;
    const digit *d = ((PyLongObject *)o)->ob_digit;
    i128 v = 0;
    for (Py_ssize_t i = nd - 1; i >= 0; i--) v = (v << PyLong_SHIFT) | d[i];
    *out = v;
    return 1;
#else
    (void)o;
    (void)out;
    return 0;
#endif
}

/* bisect_left(list, x) for a non-negative x below 2**120 given as a value; the list's items are
 * compared as Python ints (straight from their digits where they are small exact ints). -1 on error. */
static Py_ssize_t bisect_left_u120(PyObject *list, i128 x) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(list);
    PyObject *xo = NULL;
    while (lo < hi) {
        Py_ssize_t mid = ((size_t)lo + hi) / 2;
        PyObject *item = PyList_GET_ITEM(list, mid);
        i128 v;
        int lt;
        if (fast_u120(item, &v)) {
            lt = v < x;
        } else {
            if (!xo && !(xo = from_i128(x))) return -1;
            lt = PyObject_RichCompareBool(item, xo, Py_LT);
            if (lt < 0) {
                Py_DECREF(xo);
                return -1;
            }
        }
        if (lt)
            lo = mid + 1;
        else
            hi = mid;
    }
    Py_XDECREF(xo);
    return lo;
}

/* bisect.bisect_left(list, x). -1 on error. */
static Py_ssize_t bisect_left(PyObject *list, PyObject *x) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(list);
    while (lo < hi) {
        Py_ssize_t mid = ((size_t)lo + hi) / 2;
        int lt = PyObject_RichCompareBool(PyList_GET_ITEM(list, mid), x, Py_LT);
        if (lt < 0) return -1;
        if (lt)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* bisect_left of an int64 value in a list of Python ints (compared as Python does). */
static Py_ssize_t bisect_left_i64(PyObject *list, int64_t v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x) return -1;
    Py_ssize_t j = bisect_left(list, x);
    Py_DECREF(x);
    return j;
}

/* bisect.insort(list, x) == insort_right. 0 / -1. */
static int insort_right_i64(PyObject *list, int64_t v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x) return -1;
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(list);
    while (lo < hi) {
        Py_ssize_t mid = ((size_t)lo + hi) / 2;
        int lt = PyObject_RichCompareBool(x, PyList_GET_ITEM(list, mid), Py_LT);
        if (lt < 0) {
            Py_DECREF(x);
            return -1;
        }
        if (lt)
            hi = mid;
        else
            lo = mid + 1;
    }
    int rc = PyList_Insert(list, lo, x);
    Py_DECREF(x);
    return rc;
}

static inline int list_del(PyObject *list, Py_ssize_t j) { return PyList_SetSlice(list, j, j + 1, NULL); }

/* dict.pop(key, None): a new reference, or NULL with no error set when absent (NULL + error on failure). */
static PyObject *missing; /* a private default for dict_pop: no dict here holds it */

static PyObject *dict_pop(PyObject *d, PyObject *key) {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
    /* one look-up instead of two: 3.11-3.12's _PyDict_Pop(dict, key, default) */
    PyObject *v = _PyDict_Pop(d, key, missing);
    if (v == missing) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
#else
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (!v) return NULL;
    Py_INCREF(v);
    if (PyDict_DelItem(d, key) < 0) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
#endif
}

static PyObject *dict_pop_i64(PyObject *d, int64_t k) {
    PyObject *key = PyLong_FromLongLong(k);
    if (!key) return NULL;
    PyObject *v = dict_pop(d, key);
    Py_DECREF(key);
    return v;
}

static int dict_set_i64(PyObject *d, int64_t k, int64_t v) {
    PyObject *key = PyLong_FromLongLong(k);
    if (!key) return -1;
    PyObject *val = PyLong_FromLongLong(v);
    if (!val) {
        Py_DECREF(key);
        return -1;
    }
    int rc = PyDict_SetItem(d, key, val);
    Py_DECREF(key);
    Py_DECREF(val);
    return rc;
}

/* d.get(k): borrowed, NULL when absent (check PyErr_Occurred). */
static PyObject *dict_get_i64(PyObject *d, int64_t k) {
    PyObject *key = PyLong_FromLongLong(k);
    if (!key) return NULL;
    PyObject *v = PyDict_GetItemWithError(d, key);
    Py_DECREF(key);
    return v;
}

static int list_append_i64(PyObject *list, int64_t v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x) return -1;
    int rc = PyList_Append(list, x);
    Py_DECREF(x);
    return rc;
}

static int list_set_i64(PyObject *list, Py_ssize_t j, int64_t v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x) return -1;
    return PyList_SetItem(list, j, x); /* steals x */
}

static int set_attr_i64(PyObject *o, const char *name, int64_t v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x) return -1;
    int rc = PyObject_SetAttrString(o, name, x);
    Py_DECREF(x);
    return rc;
}

static int get_attr_i64(PyObject *o, const char *name, int64_t *out) {
    PyObject *x = PyObject_GetAttrString(o, name);
    if (!x) return -1;
    int rc = as_i64(x, out);
    Py_DECREF(x);
    return rc;
}

/* ------------------------------------------------------------------ the allocator model (policy._Model.run) */

/* A block is a list [size, address, prev | None, next | None, state]. */

/* truth of a block's state (True, False or None; anything else as Python tests it) */
static inline int truth(PyObject *o) {
    if (o == Py_True) return 1;
    if (o == Py_False || o == Py_None) return 0;
    return PyObject_IsTrue(o);
}
enum { B_SIZE = 0, B_ADDR = 1, B_PREV = 2, B_NEXT = 3, B_STATE = 4 };
#define BGET(b, k) PyList_GET_ITEM((b), (k))

static int bset(PyObject *b, Py_ssize_t k, PyObject *v) {
    Py_INCREF(v);
    return PyList_SetItem(b, k, v);
}

static int bset_i64(PyObject *b, Py_ssize_t k, int64_t v) { return list_set_i64(b, k, v); }

/* ------------------------------------------------------------------ the recorded replay (recorded._Replayer.run) */

typedef struct {
    long alloc, free_requested, free_completed, seg_alloc, seg_free, seg_map, seg_unmap, fused;
    int plain, strict;
    int64_t min_block, small;
    i128 over_s, below_s, over_l, below_l;
    PyObject *round_size, *inconsistent;
} RecParams;

static int parse_rec_params(PyObject *d, RecParams *P) {
    const char *names[] = {"alloc", "free_requested", "free_completed", "seg_alloc", "seg_free", "seg_map",
                           "seg_unmap", "fused", "plain", "strict", "min_block", "small", "over_s", "below_s",
                           "over_l", "below_l", "round_size", "inconsistent"};
    PyObject *v[18];
    for (int k = 0; k < 18; k++) {
        v[k] = PyDict_GetItemString(d, names[k]);
        if (!v[k]) {
            PyErr_Format(PyExc_KeyError, "recorded_run: parameter %s missing", names[k]);
            return -1;
        }
    }
    long *codes[] = {&P->alloc, &P->free_requested, &P->free_completed, &P->seg_alloc,
                     &P->seg_free, &P->seg_map, &P->seg_unmap, &P->fused};
    for (int k = 0; k < 8; k++) *codes[k] = PyLong_AsLong(v[k]);
    if (PyErr_Occurred()) return -1;
    if ((P->plain = PyObject_IsTrue(v[8])) < 0 || (P->strict = PyObject_IsTrue(v[9])) < 0) return -1;
    if (as_i64(v[10], &P->min_block) < 0 || as_i64(v[11], &P->small) < 0) return -1;
    if (as_i128(v[12], &P->over_s) < 0 || as_i128(v[13], &P->below_s) < 0 || as_i128(v[14], &P->over_l) < 0 ||
        as_i128(v[15], &P->below_l) < 0)
        return -1;
    if (P->min_block <= 0 || (P->min_block & (P->min_block - 1))) {
        PyErr_SetString(PyExc_ValueError, "recorded_run: min_block must be a power of two");
        return -1;
    }
    P->round_size = v[16];
    P->inconsistent = v[17];
    return 0;
}

/* raise inconsistent(i, reason) */
static void raise_inconsistent(const RecParams *P, int64_t i, const char *reason) {
    PyObject *exc = PyObject_CallFunction(P->inconsistent, "Ls", (long long)i, reason);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* rep._issue(i, kind, reason): raises in strict mode. 0 / -1. */
static int call_issue(PyObject *rep, int64_t i, const char *kind, const char *reason) {
    PyObject *r = PyObject_CallMethod(rep, "_issue", "Lss", (long long)i, kind, reason);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

/* The loop's state kept in C locals, written back to the replayer around every call into it. */
typedef struct {
    PyObject *rep;
    int64_t tmin, tlimit, cmode;
} RecState;

static int sync_out(RecState *S) {
    return set_attr_i64(S->rep, "tmin", S->tmin) < 0 || set_attr_i64(S->rep, "tlimit", S->tlimit) < 0 ? -1 : 0;
}

static int sync_in(RecState *S, int with_cmode) {
    if (get_attr_i64(S->rep, "tmin", &S->tmin) < 0 || get_attr_i64(S->rep, "tlimit", &S->tlimit) < 0) return -1;
    if (with_cmode && get_attr_i64(S->rep, "cmode", &S->cmode) < 0) return -1;
    return 0;
}

/* self._retrack(); tmin, tlimit = self.tmin, self.tlimit */
static int retrack(RecState *S) {
    PyObject *r = PyObject_CallMethod(S->rep, "_retrack", NULL);
    if (!r) return -1;
    Py_DECREF(r);
    return sync_in(S, 0);
}

/* c = fcount[size]; if c > 1: fcount[size] = c - 1 else: del fcount[size]; del dist[bisect_left(dist, size)] */
static int count_down(PyObject *fcount, PyObject *dist, int64_t size, int *emptied) {
    PyObject *key = PyLong_FromLongLong(size);
    if (!key) return -1;
    PyObject *co = PyDict_GetItemWithError(fcount, key);
    int64_t c;
    if (!co) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        Py_DECREF(key);
        return -1;
    }
    if (as_i64(co, &c) < 0) {
        Py_DECREF(key);
        return -1;
    }
    int rc;
    if (c > 1) {
        PyObject *nc = PyLong_FromLongLong(c - 1);
        rc = nc ? PyDict_SetItem(fcount, key, nc) : -1;
        Py_XDECREF(nc);
        *emptied = 0;
    } else {
        rc = PyDict_DelItem(fcount, key);
        if (rc == 0) {
            Py_ssize_t j = bisect_left(dist, key);
            rc = j < 0 ? -1 : list_del(dist, j);
        }
        *emptied = 1;
    }
    Py_DECREF(key);
    return rc;
}

/* c = fcount.get(size, 0); if c: fcount[size] = c + 1 else: fcount[size] = 1; insort(dist, size) */
static int count_up(PyObject *fcount, PyObject *dist, int64_t size, int *added) {
    PyObject *key = PyLong_FromLongLong(size);
    if (!key) return -1;
    PyObject *co = PyDict_GetItemWithError(fcount, key);
    int64_t c = 0;
    if (!co && PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    if (co && as_i64(co, &c) < 0) {
        Py_DECREF(key);
        return -1;
    }
    int rc;
    if (c) {
        PyObject *nc = PyLong_FromLongLong(c + 1);
        rc = nc ? PyDict_SetItem(fcount, key, nc) : -1;
        Py_XDECREF(nc);
        *added = 0;
    } else {
        PyObject *one = PyLong_FromLong(1);
        rc = one ? PyDict_SetItem(fcount, key, one) : -1;
        Py_XDECREF(one);
        if (rc == 0) rc = insort_right_i64(dist, size);
        *added = 1;
    }
    Py_DECREF(key);
    return rc;
}

/* lf_i.append(i); lf_v.append(dist[-1]) */
static int record_largest(PyObject *lf_i, PyObject *lf_v, PyObject *dist, int64_t i) {
    Py_ssize_t nd = PyList_GET_SIZE(dist);
    if (nd == 0) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return -1;
    }
    if (list_append_i64(lf_i, i) < 0) return -1;
    return PyList_Append(lf_v, PyList_GET_ITEM(dist, nd - 1));
}

static int ns_record(PyObject *ns_i, PyObject *ns_v, int64_t i, int64_t v) {
    return list_append_i64(ns_i, i) < 0 || list_append_i64(ns_v, v) < 0 ? -1 : 0;
}

/* seg_size.get(addr) == value */
static int seg_size_is(PyObject *seg_size, int64_t addr, int64_t value) {
    PyObject *v = dict_get_i64(seg_size, addr);
    if (!v) return PyErr_Occurred() ? -1 : 0;
    int64_t x;
    if (as_i64(v, &x) < 0) return -1;
    return x == value;
}

/* bs[ref] as a value */
static int bs_get(PyObject *bs, int64_t ref, int64_t *out) {
    if (ref < 0 || ref >= PyList_GET_SIZE(bs)) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return -1;
    }
    return as_i64(PyList_GET_ITEM(bs, ref), out);
}

static int bs_set(PyObject *bs, int64_t j, int64_t v) {
    if (j < 0 || j >= PyList_GET_SIZE(bs)) {
        PyErr_SetString(PyExc_IndexError, "list assignment index out of range");
        return -1;
    }
    return list_set_i64(bs, j, v);
}

static PyObject *recorded_run(PyObject *self, PyObject *args) {
    PyObject *rep, *p_idx, *act, *addr, *size, *pdict;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!O!", &rep, &PyList_Type, &p_idx, &PyBytes_Type, &act, &PyList_Type, &addr,
                          &PyList_Type, &size, &PyDict_Type, &pdict))
        return NULL;
    RecParams P;
    if (parse_rec_params(pdict, &P) < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(p_idx);
    if (PyBytes_GET_SIZE(act) != n || PyList_GET_SIZE(addr) != n || PyList_GET_SIZE(size) != n) {
        PyErr_SetString(PyExc_ValueError, "recorded_run: columns of different lengths");
        return NULL;
    }
    const unsigned char *acts = (const unsigned char *)PyBytes_AS_STRING(act);
    RecState S = {rep, 0, 0, 0};
    PyObject *o[13] = {NULL};
    const char *names[13] = {"bs", "ns_i", "ns_v", "lf_i", "lf_v", "free_sz", "free_end",
                             "used", "seg_size", "fcount", "dist", "ignored", "adj_alloc"};
    PyObject *result = NULL, *counts_split = NULL;
    for (int k = 0; k < 13; k++)
        if (!(o[k] = PyObject_GetAttrString(rep, names[k]))) goto done;
    PyObject *bs = o[0], *ns_i = o[1], *ns_v = o[2], *lf_i = o[3], *lf_v = o[4], *free_sz = o[5], *free_end = o[6];
    PyObject *used = o[7], *seg_size = o[8], *fcount = o[9], *dist = o[10], *ignored = o[11], *adj_alloc = o[12];
    if (!PyList_Check(bs) || !PyList_Check(ns_i) || !PyList_Check(ns_v) || !PyList_Check(lf_i) ||
        !PyList_Check(lf_v) || !PyDict_Check(free_sz) || !PyDict_Check(free_end) || !PyDict_Check(used) ||
        !PyDict_Check(seg_size) || !PyDict_Check(fcount) || !PyList_Check(dist) || !PyList_Check(ignored) ||
        !PyDict_Check(adj_alloc)) {
        PyErr_SetString(PyExc_TypeError, "recorded_run: unexpected replayer state");
        goto done;
    }
    if (!(counts_split = PyObject_GetAttrString(rep, "_counts_split"))) goto done;
    if (sync_in(&S, 1) < 0) goto done;

#define TRY(x)                                                                                                     \
    do {                                                                                                           \
        if ((x) < 0) goto done;                                                                                    \
    } while (0)

    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t i, ad, sz;
        long a = acts[k];
        PyObject *ad_o = PyList_GET_ITEM(addr, k);
        TRY(as_i64(PyList_GET_ITEM(p_idx, k), &i));
        TRY(as_i64(ad_o, &ad));
        TRY(as_i64(PyList_GET_ITEM(size, k), &sz));
        if (a == P.alloc) {
            PyObject *fo = dict_pop(free_sz, ad_o);
            if (!fo) {
                if (PyErr_Occurred()) goto done;
                TRY(sync_out(&S));
                TRY(set_attr_i64(rep, "cur", i));
                PyObject *r = PyObject_CallMethod(rep, "_alloc_slow", "OOO", PyList_GET_ITEM(p_idx, k), ad_o,
                                                  PyList_GET_ITEM(size, k));
                if (!r) goto done;
                Py_DECREF(r);
                TRY(sync_in(&S, 1));
                continue;
            }
            int64_t f;
            int rc = as_i64(fo, &f);
            Py_DECREF(fo);
            TRY(rc);
            int64_t r;
            if (P.plain) {
                r = sz >= P.min_block ? (sz + P.min_block - 1) & -P.min_block : P.min_block;
            } else {
                PyObject *ro = PyObject_CallOneArg(P.round_size, PyList_GET_ITEM(size, k));
                if (!ro) goto done;
                rc = as_i64(ro, &r);
                Py_DECREF(ro);
                TRY(rc);
            }
            int64_t rem = f - r;
            if (f >= S.tmin) {
                int emptied;
                TRY(count_down(fcount, dist, f, &emptied));
                if (emptied) {
                    if (PyList_GET_SIZE(dist) == 1) TRY(retrack(&S));
                    TRY(record_largest(lf_i, lf_v, dist, i));
                }
            }
            int cnt = S.cmode == 0;
            if (!cnt && S.cmode == 2) {
                PyObject *c = PyObject_CallOneArg(counts_split, ad_o);
                if (!c) goto done;
                cnt = PyObject_IsTrue(c);
                Py_DECREF(c);
                TRY(cnt);
            }
            if (cnt) {
                int whole = seg_size_is(seg_size, ad, f);
                TRY(whole);
                if (whole) TRY(ns_record(ns_i, ns_v, i, -f));
            } else {
                TRY(ns_record(ns_i, ns_v, i, -f));
            }
            if (rem < 0) {
                TRY(call_issue(rep, i, "block-too-small", "alloc larger than the free block"));
                rem = 0;
            }
            int split = r <= P.small ? ((i128)rem > P.over_s && (i128)r < P.below_s)
                                     : ((i128)rem > P.over_l && (i128)r < P.below_l);
            if (split) {
                int64_t nf = ad + r;
                PyObject *nfo = PyLong_FromLongLong(nf);
                if (!nfo) goto done;
                PyObject *remo = PyLong_FromLongLong(rem);
                rc = remo ? PyDict_SetItem(free_sz, nfo, remo) : -1;
                Py_XDECREF(remo);
                if (rc == 0) {
                    PyObject *endo = PyLong_FromLongLong(ad + f);
                    rc = endo ? PyDict_SetItem(free_end, endo, nfo) : -1;
                    Py_XDECREF(endo);
                }
                Py_DECREF(nfo);
                TRY(rc);
                if (rem >= S.tmin) {
                    int added;
                    TRY(count_up(fcount, dist, rem, &added));
                    if (added) {
                        if (PyList_GET_SIZE(dist) > S.tlimit) TRY(retrack(&S));
                        TRY(record_largest(lf_i, lf_v, dist, i));
                    }
                }
                if (!cnt) TRY(ns_record(ns_i, ns_v, i, rem));
                TRY(bs_set(bs, i, r));
            } else {
                PyObject *endo = PyLong_FromLongLong(ad + f);
                if (!endo) goto done;
                rc = PyDict_DelItem(free_end, endo);
                Py_DECREF(endo);
                TRY(rc);
                TRY(bs_set(bs, i, f));
            }
            TRY(PyDict_SetItem(used, ad_o, PyList_GET_ITEM(p_idx, k)));
        } else if (a == P.fused || a == P.free_completed) {
            PyObject *refo = dict_pop(used, ad_o);
            if (!refo && PyErr_Occurred()) goto done;
            int64_t ref = 0, j, b;
            if (refo) {
                int rc = as_i64(refo, &ref);
                Py_DECREF(refo);
                TRY(rc);
            }
            if (a == P.fused) {
                j = i + 1;
                if (!refo || ref < 0) {
                    raise_inconsistent(&P, i, "free of an address with no allocated block");
                    goto done;
                }
                TRY(bs_get(bs, ref, &b)); /* bs[i] (the request's) is copied from bs[j] after the pass */
            } else {
                j = i;
                if (!refo) {
                    TRY(call_issue(rep, i, "unknown-free", "free of an address with no active block"));
                    TRY(list_append_i64(ignored, i));
                    continue;
                }
                if (ref < 0) {
                    TRY(bs_get(bs, ~ref, &b));
                } else {
                    TRY(bs_get(bs, ref, &b));
                    if (P.strict) {
                        TRY(dict_set_i64(used, ad, ref));
                        raise_inconsistent(&P, i, "free_completed without free_requested");
                        goto done;
                    }
                    TRY(call_issue(rep, i, "unrequested-free", "free_completed without free_requested"));
                    TRY(dict_set_i64(adj_alloc, i, -b));
                }
            }
            TRY(bs_set(bs, j, b));
            int cnt = S.cmode == 0;
            if (!cnt && S.cmode == 2) {
                PyObject *c = PyObject_CallOneArg(counts_split, ad_o);
                if (!c) goto done;
                cnt = PyObject_IsTrue(c);
                Py_DECREF(c);
                TRY(cnt);
            }
            int64_t start = ad, end = ad + b;
            /* Merge with free neighbours of the same segment. */
            PyObject *nso = dict_pop_i64(free_sz, end);
            if (!nso && PyErr_Occurred()) goto done;
            if (nso) {
                int64_t ns;
                int rc = as_i64(nso, &ns);
                if (rc == 0) {
                    PyObject *endo = PyLong_FromLongLong(end);
                    rc = endo ? PyDict_Contains(seg_size, endo) : -1;
                    if (rc == 1) {
                        rc = PyDict_SetItem(free_sz, endo, nso);
                        Py_DECREF(endo);
                        Py_DECREF(nso);
                        TRY(rc);
                    } else {
                        Py_XDECREF(endo);
                        Py_DECREF(nso);
                        TRY(rc);
                        PyObject *k2 = PyLong_FromLongLong(end + ns);
                        if (!k2) goto done;
                        rc = PyDict_DelItem(free_end, k2);
                        Py_DECREF(k2);
                        TRY(rc);
                        if (ns >= S.tmin) {
                            int emptied;
                            TRY(count_down(fcount, dist, ns, &emptied));
                        }
                        end += ns;
                    }
                } else {
                    Py_DECREF(nso);
                    goto done;
                }
            }
            PyObject *pso = dict_pop(free_end, ad_o);
            if (!pso && PyErr_Occurred()) goto done;
            if (pso) {
                int in_seg = PyDict_Contains(seg_size, ad_o);
                if (in_seg < 0) {
                    Py_DECREF(pso);
                    goto done;
                }
                if (in_seg) {
                    int rc = PyDict_SetItem(free_end, ad_o, pso);
                    Py_DECREF(pso);
                    TRY(rc);
                } else {
                    int64_t ps;
                    int rc = as_i64(pso, &ps);
                    PyObject *pszo = rc == 0 ? dict_pop(free_sz, pso) : NULL;
                    if (!pszo && rc == 0 && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, pso);
                    Py_DECREF(pso);
                    if (!pszo) goto done;
                    int64_t psz;
                    rc = as_i64(pszo, &psz);
                    Py_DECREF(pszo);
                    TRY(rc);
                    if (psz >= S.tmin) {
                        int emptied;
                        TRY(count_down(fcount, dist, psz, &emptied));
                    }
                    start = ps;
                }
            }
            int64_t m = end - start;
            {
                PyObject *so = PyLong_FromLongLong(start), *mo = PyLong_FromLongLong(m), *eo = PyLong_FromLongLong(end);
                int rc = so && mo && eo ? PyDict_SetItem(free_sz, so, mo) : -1;
                if (rc == 0) rc = PyDict_SetItem(free_end, eo, so);
                Py_XDECREF(so);
                Py_XDECREF(mo);
                Py_XDECREF(eo);
                TRY(rc);
            }
            if (m >= S.tmin) {
                int added;
                TRY(count_up(fcount, dist, m, &added));
                if (added) {
                    if (PyList_GET_SIZE(dist) > S.tlimit) TRY(retrack(&S));
                    TRY(record_largest(lf_i, lf_v, dist, j));
                }
            }
            if (!cnt) {
                TRY(ns_record(ns_i, ns_v, j, b));
            } else {
                int whole = seg_size_is(seg_size, start, m);
                TRY(whole);
                if (whole) TRY(ns_record(ns_i, ns_v, j, m));
            }
        } else if (a == P.free_requested) {
            PyObject *refo = PyDict_GetItemWithError(used, ad_o);
            if (!refo && PyErr_Occurred()) goto done;
            int64_t ref = -1;
            if (refo) TRY(as_i64(refo, &ref));
            if (ref < 0) {
                TRY(call_issue(rep, i, "unknown-free", "free of an address with no allocated block"));
                TRY(list_append_i64(ignored, i));
            } else {
                int64_t b;
                TRY(dict_set_i64(used, ad, ~ref));
                TRY(bs_get(bs, ref, &b));
                TRY(bs_set(bs, i, b));
            }
        } else if (a >= P.seg_alloc && a <= P.seg_unmap) {
            const char *name = a == P.seg_alloc ? "_segment_alloc"
                               : a == P.seg_free ? "_segment_free"
                               : a == P.seg_map  ? "_segment_map"
                                                 : "_segment_unmap";
            TRY(sync_out(&S));
            TRY(set_attr_i64(rep, "cur", i));
            PyObject *r = PyObject_CallMethod(rep, name, "OOO", PyList_GET_ITEM(p_idx, k), ad_o,
                                              PyList_GET_ITEM(size, k));
            if (!r) goto done;
            Py_DECREF(r);
            TRY(sync_in(&S, 1));
        }
    }
#undef TRY
    if (sync_out(&S) < 0) goto done;
    result = Py_None;
    Py_INCREF(result);
done:
    for (int k = 0; k < 13; k++) Py_XDECREF(o[k]);
    Py_XDECREF(counts_split);
    return result;
}

PyObject *oomscope_policy_engine(PyObject *self, PyObject *args); /* _policycore.c */

static PyMethodDef methods[] = {
    {"policy_engine", oomscope_policy_engine, METH_VARARGS, "policy._Model.run on C state (_policycore.c)."},
    {"recorded_run", recorded_run, METH_VARARGS, "recorded._Replayer.run's loop (see analysis/allocator/compiled.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_replaycore",
                                       "The allocator model's and the recorded replay's per-event loops in C.", -1,
                                       methods};

PyMODINIT_FUNC PyInit__replaycore(void) {
    if (!missing && !(missing = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type))) return NULL;
    return PyModule_Create(&moduledef);
}
