/* analysis.allocator._replaycore.policy_engine: the allocator model's whole replay (cachemodel._Model.run)
 * in C, on C structures.
 *
 * Import once, run natively, export once. The engine reads the Python model's state (after
 * ``seed`` / ``seed_live``, which stay Python) into C: a block arena (size, address, prev/next
 * indices, state free/allocated/unmapped), one sorted array per free list of the packed keys
 * ``size << sh | addr`` as unsigned 128-bit values (the very integers Python's lists hold, so the
 * order is Python's even where an address passes 2**sh) beside their block indices, unmapped
 * ranges by address, open-addressing hash maps for amap/pmap/pend/heads/gcb (each entry keeps the
 * order it was first inserted in, as a Python dict does), the segment-event record and the
 * placement model. Every request, the rare paths included (miss, garbage collection, alloc_block,
 * release_available, release_cached with pending frees and private pools, expandable segments'
 * map/unmap, OOM entries, transient OOMs), runs here; at the end the state is written back
 * into the Python model as the Python loop would have left it, so what follows ``run`` (layout,
 * results, tests inspecting the model) reads it unchanged.
 *
 * The statements follow the Python methods of ``cachemodel._Model`` one for one (their names are
 * given); the Python loop stays the reference (tests/analysis/test_replaycore.py). No number of the
 * allocator's rules is written here: the caller passes each one (split rules, fit limit, pages,
 * the GC threshold in bytes, the limit, the reservation stride and size, the placement's chunk
 * and top), taken from its one definition (analysis/allocator/config.py, placement.py, cachestate.py, cachemodel.py),
 * and ``allocation_size`` is config.py's own function, asked for every request size before the
 * loop. The loop itself touches no Python object and runs without the GIL, so the report's policy
 * replays run in threads side by side (analysis.parallel) instead of forked processes.
 *
 * Declining: the engine works on sizes and addresses in [0, 2**62) and on a model whose free
 * lists hold exactly the blocks their keys name. A state outside that (only a hostile trace makes
 * one: overlapping recorded segments, sizes near 2**63) is not guessed at: the engine stops,
 * leaves the Python model untouched, and returns (None, reason); the caller then runs the Python
 * loop, which does whatever the reference does there.
 *
 * Memory: every array grows by checked doubling; every allocation is checked (PyMem_Raw*: no GIL
 * needed; a failed one returns -1 with no exception set, which the entry point turns into
 * MemoryError); everything is freed on every path out (engine_free).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef __int128 i128;
typedef unsigned __int128 u128;

#define VMAX ((int64_t)1 << 62) /* sizes and addresses the engine takes: [0, VMAX) */

enum { ST_ALLOC = 0, ST_FREE = 1, ST_UNMAPPED = 2, ST_DEAD = 3 };

typedef struct {
    int64_t size, addr;
    int32_t prev, next; /* -1: none */
    int8_t state;
    int32_t at; /* a free block: the chunk of its free list it was last put in (fl_find's first guess) */
} Blk;

/* A free list: its packed keys in order, beside their blocks, in chunks of at most FCAP entries (a
 * two-level sorted list: an insert or delete moves at most one chunk, where one flat array would
 * move half the list; free lists of thousands of blocks are common). No chunk is empty.
 *
 * Every search and shift has a fixed length, so that no branch depends on a list's length or on
 * where a key falls: a chunk's keys past its n entries, and the chunks' last keys past nc, are
 * KMAX (above every key: keys are below 2**125), and a search counts eight keys at a time (count8: a
 * compare each, none a branch), over the chunks' last keys first at a stride, then side by side (fl_chunk_by),
 * then in the chunk. A chunk's arrays
 * are twice FCAP long, the upper half always KMAX, so that an insert or delete moves a fixed
 * FCAP entries wherever it falls (the entries past n it moves are KMAX). A branch on the keys
 * or a length there is mispredicted about every other time, and costs more than the few more
 * compares and moves. FCAP 8: an insert or delete moves 8 entries (128 + 32 bytes), half what 16 moved,
 * and the search over the chunks' last keys, a halving longer, costs less than that saves (the four
 * policy passes of the 460 MB trace 339 -> 324 ms, 10 of 10 alternated pairs; 4 was slower than 16).
 * lowerF counts eight keys: FCAP is at least that. */
#define FCAP 8
#define LAST_PAD 8 /* KMAX keys past a list's capl last keys: fl_chunk_by's last count may read them */
_Static_assert(FCAP >= 8 && (FCAP & (FCAP - 1)) == 0, "lowerF counts 8 keys of a power-of-two run");
/* Keys come in two widths, one per engine call (Engine.w; the loop compiled once per width: BY_WIDTH): the 128-bit packed key
 * (pack_key) Python's lists hold, or a 64-bit one that orders the same blocks the same way, where it
 * fits: (size >> 9) << K64_ADDR | (addr - base) >> 9, base a list's own (its first block's address less
 * 2**44). Half the bytes to move and one compare per key: the four policy passes of the 460 MB trace
 * 277 -> 250 ms (engine calls in process, 9 of 9 alternated pairs; all four fit). A key fits when size and address are multiples of 512, the
 * size below K64_SIZES * 512, the address in the list's window (2**46 from base, below 2**sh: keys
 * order as (size, address) there); the first that does not stops the call, which runs again from the
 * start with 128-bit keys (bkey, policy_engine). KMAX, per width, is above every key that fits. */
#define KMAX (~(u128)0)
#define KMAX64 (~(uint64_t)0)
#define K64_ADDR 37
#define K64_SIZES (((uint64_t)1 << (64 - K64_ADDR)) - 1) /* size codes below it: no key is KMAX64 */
typedef struct {
    int n;
    int32_t blk[2 * FCAP];
    union {
        u128 key[2 * FCAP];
        uint64_t key64[2 * FCAP];
    };
} Chunk;

typedef struct {
    Chunk **c;
    void *last; /* each chunk's last key, side by side (KMAX past nc, and LAST_PAD more past capl): the search
                 * over chunks reads no chunk */
    Chunk *spare; /* the last chunk emptied, kept for the next one needed (a list often empties) */
    size_t nc, capc, capl; /* capl: a power of two, at least FCAP */
    Py_ssize_t n;
    int based;          /* base set (64-bit keys: key64, last as uint64_t) */
    int64_t base, span; /* 64-bit keys: the addresses [base, base + span) fit */
} FList;

typedef struct {
    Py_ssize_t c; /* chunk; nc: past the end */
    int j;        /* entry in it */
} Pos;

typedef struct {
    int64_t *addr;
    int32_t *blk;
    Py_ssize_t n, cap;
} UList; /* unmapped ranges of expandable reservations, by address */

typedef struct {
    int64_t key, val;
    int32_t aux;
    uint8_t used;
    uint64_t seq; /* insertion order (a Python dict's iteration order) */
} HEnt;

typedef struct {
    HEnt *e;
    size_t cap, n;
    uint64_t seq;
} HMap;

typedef struct {
    int64_t *v;
    size_t n, cap;
} Vec;

typedef struct {
    int64_t addr, size;
} Range;

typedef struct {
    /* the rules' numbers, from the caller */
    int sh, ns, nl, nbp, exp, gc_on, mss_on, has_limit, kind_mirror;
    uint64_t key_mul; /* 2**sh (pack_key) */
    i128 mss, nsr, limit, gc_threshold;
    /* the per-request thresholds, clamped into 64 bits (clamped) */
    int64_t fit_mss, fit_nsr;
    int64_t *over, *below;
    int64_t *page, *bp_lists;
    int64_t resv_stride, resv_bytes, chunk, top;
    long seg_alloc, seg_free, seg_map, seg_unmap;
    long op_alloc, op_free, op_free_req, op_free_done, op_oom, op_flush;
    PyObject *allocation_size;
    int64_t *rec_act, *rec_size, *rec_addr;
    Py_ssize_t n_rec;
    int64_t *free_pool, *free_since;
    Py_ssize_t n_freeable;
    int64_t *transient;
    Py_ssize_t n_transient;
    /* the state */
    Blk *b;
    int32_t nb, capb;
    Vec freeslots;
    FList *fl;
    UList *ul;
    HMap amap, pmap, pend, heads, gcb, asz;
    Vec seg_act, seg_size, seg_idx, flushes;
    Blk sink; /* link_prev's store where there is no block */
    /* amap by the requests' pairing (Scan.sid), where the scan paired them and the model's amap was empty:
     * each slot's block (-1: none) and the request that put it there (amap_pop, amap_put, slots_to_amap) */
    const int32_t *sid;
    int32_t *slot_blk;
    Py_ssize_t *slot_req;
    int32_t nslots;
    i128 reserved, peak;
    int64_t gcc, next_resv, cur;
    int lockstep;
    int va; /* -1: not made yet, 0: driver, 1: mirror */
    int64_t va_low, va_next;
    Range *va_free;
    size_t va_n, va_cap;
    const char *declined;
    int w, misfit; /* w: 64-bit free-list keys (BY_WIDTH); misfit: one did not fit, the call runs again in 128 */
    /* how often each path ran (tests assert that the paths they mean to cover ran) */
    int64_t counts[16];
} Engine;

enum {
    C_MISS, C_GC, C_GC_FREED, C_AVAIL, C_AVAIL_FREED, C_FLUSH, C_PEND_SYNCED, C_POOL_FREED, C_PRIVATE,
    C_MAP, C_UNMAP, C_RESERVATION, C_PLACED, C_LOCKSTEP_ADDR, C_TRANSIENT, C_OOM_FAILED, C_N
};
static const char *count_names[C_N] = {
    "miss", "gc", "gc_freed", "release_available", "available_freed", "release_cached", "pending_synced",
    "segments_freed", "private_pool_released", "map", "unmap", "reservation", "placed", "recorded_address",
    "transient_freed", "failed",
};

#define DECLINE(E, why)      \
    do {                     \
        (E)->declined = why; \
        return -1;           \
    } while (0)
#define TRY(x)                \
    do {                      \
        if ((x) < 0) return -1; \
    } while (0)

/* ------------------------------------------------------------------ growable arrays */

/* The growing, out of line and marked cold: the callers' usual path (room left) then saves and
 * restores no registers for it. */
static __attribute__((noinline, cold)) int grow_to(void **p, size_t *cap, size_t need, size_t item) {
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > ((size_t)PY_SSIZE_T_MAX / item) / 2) {
            return -1;
        }
        c *= 2;
    }
    void *q = PyMem_RawRealloc(*p, c * item);
    if (!q) {
        return -1;
    }
    *p = q;
    *cap = c;
    return 0;
}

static inline int grow(void **p, size_t *cap, size_t need, size_t item) {
    return need <= *cap ? 0 : grow_to(p, cap, need, item);
}

static int vec_push(Vec *v, int64_t x) {
    if (grow((void **)&v->v, &v->cap, v->n + 1, sizeof(int64_t)) < 0) return -1;
    v->v[v->n++] = x;
    return 0;
}

/* ------------------------------------------------------------------ hash maps (int64 -> value) */

static inline uint64_t mix(int64_t k) {
    uint64_t x = (uint64_t)k;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static Py_ssize_t hm_find(const HMap *m, int64_t key) {
    if (!m->cap) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
        if (!m->e[i].used) return -1;
        if (m->e[i].key == key) return (Py_ssize_t)i;
    }
}

static int hm_rehash(HMap *m, size_t cap) {
    HEnt *old = m->e;
    size_t oldcap = m->cap;
    HEnt *e = PyMem_RawCalloc(cap, sizeof(HEnt));
    if (!e) {
        return -1;
    }
    size_t mask = cap - 1;
    for (size_t j = 0; j < oldcap; j++) {
        if (!old[j].used) continue;
        size_t i = mix(old[j].key) & mask;
        while (e[i].used) i = (i + 1) & mask;
        e[i] = old[j];
    }
    PyMem_RawFree(old);
    m->e = e;
    m->cap = cap;
    return 0;
}

/* d[key] = (val, aux): a new key goes last in the order, an existing one keeps its place. The table
 * is kept at most an eighth full: at half full, the probes' and the deletions' backward shifts'
 * loops ran long enough to be mispredicted on most requests (the four replays of a 460 MB trace
 * took 12% more CPU), and at a quarter the second probe of one lookup in five still was (the maps
 * hold hundreds of entries: an eighth full is still a few dozen kB). */
static __attribute__((noinline, cold)) int hm_grow(HMap *m) { /* out of line: as grow_to */
    size_t cap = m->cap ? m->cap * 2 : 64;
    if (cap > ((size_t)PY_SSIZE_T_MAX / sizeof(HEnt))) {
        return -1;
    }
    return hm_rehash(m, cap);
}

static int hm_set(HMap *m, int64_t key, int64_t val, int32_t aux) {
    if ((m->n + 1) * 8 > m->cap && hm_grow(m) < 0) return -1;
    size_t mask = m->cap - 1;
    size_t i = mix(key) & mask;
    while (m->e[i].used && m->e[i].key != key) i = (i + 1) & mask;
    if (!m->e[i].used) {
        m->e[i].used = 1;
        m->e[i].key = key;
        m->e[i].seq = m->seq++;
        m->n++;
    }
    m->e[i].val = val;
    m->e[i].aux = aux;
    return 0;
}

/* Remove slot i (linear probing: shift the following entries back, no tombstones). */
static void hm_del_at(HMap *m, size_t i) {
    size_t mask = m->cap - 1;
    size_t j = i;
    m->e[i].used = 0;
    m->n--;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->e[j].used) return;
        size_t home = mix(m->e[j].key) & mask;
        /* move e[j] into the hole at i when its home is not within (i, j] cyclically */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            m->e[i] = m->e[j];
            m->e[j].used = 0;
            i = j;
        }
    }
}

/* d.pop(key): 1 and the value when present, 0 when not. */
static int hm_pop(HMap *m, int64_t key, int64_t *val, int32_t *aux) {
    Py_ssize_t i = hm_find(m, key);
    if (i < 0) return 0;
    *val = m->e[i].val;
    if (aux) *aux = m->e[i].aux;
    hm_del_at(m, (size_t)i);
    return 1;
}

static void hm_clear(HMap *m) {
    if (m->cap) memset(m->e, 0, m->cap * sizeof(HEnt));
    m->n = 0;
}

static int cmp_seq(const void *a, const void *b) {
    uint64_t x = (*(HEnt *const *)a)->seq, y = (*(HEnt *const *)b)->seq;
    return x < y ? -1 : x > y;
}

/* The entries in a Python dict's order (new array, caller frees; NULL when out of memory). */
static HEnt **hm_ordered(const HMap *m) {
    HEnt **out = PyMem_RawMalloc((m->n ? m->n : 1) * sizeof(HEnt *));
    if (!out) {
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < m->cap; i++)
        if (m->e[i].used) out[k++] = &m->e[i];
    qsort(out, k, sizeof(HEnt *), cmp_seq);
    return out;
}

/* ------------------------------------------------------------------ blocks */

static int new_block(Engine *E, int64_t size, int64_t addr, int32_t prev, int32_t next, int8_t state) {
    int32_t k;
    if (E->freeslots.n) {
        k = (int32_t)E->freeslots.v[--E->freeslots.n];
    } else {
        if (E->nb == INT32_MAX) DECLINE(E, "too many blocks");
        size_t cap = (size_t)E->capb;
        if (grow((void **)&E->b, &cap, (size_t)E->nb + 1, sizeof(Blk)) < 0) return -1;
        if (cap > INT32_MAX) cap = INT32_MAX;
        E->capb = (int32_t)cap;
        k = E->nb++;
    }
    E->b[k] = (Blk){size, addr, prev, next, state};
    return k;
}

/* Block k's prev, where k is a block (>= 0): where it is none the store goes to the engine's sink, not
 * past a branch (whether a block has a next is the data's: 0.35M of one pass's 3.5M mispredicted branches
 * were these tests). */
static inline void link_prev(Engine *E, int32_t k, int32_t prev) {
    uintptr_t sink = (uintptr_t)&E->sink, blk = (uintptr_t)&E->b[k]; /* by a mask: a ?: here was made a branch */
    ((Blk *)(sink + ((blk - sink) & -(uintptr_t)(k >= 0))))->prev = prev;
}

static int kill_block(Engine *E, int32_t k) {
    E->b[k].state = ST_DEAD;
    return vec_push(&E->freeslots, k);
}

/* size << sh | addr, as size x 2**sh (key_mul: sh is in [1, 63], parse_params): one 64 x 64 -> 128-bit
 * multiply, where a u128 shift by a variable count takes two shifts and a test of whether the count
 * passes 64. */
static inline u128 pack_key(uint64_t key_mul, int64_t size, int64_t addr) {
    return ((u128)(uint64_t)size * key_mul) | (u128)(uint64_t)addr;
}

/* A packed key's size (key >> sh), on its two 64-bit halves (sh is in [1, 63]); a block's size is at
 * most VMAX, so it fits 64 bits. */
static inline int64_t key_size(int sh, u128 key) {
    return (int64_t)(((uint64_t)(key >> 64) << (64 - sh)) | ((uint64_t)key >> sh));
}

#define AI static inline __attribute__((always_inline))

/* The key width, a constant in the loop. Every function that reads or writes keys takes the width w (1: 64
 * bits) as its last parameter; the loop and the two free-list operations it calls out of line are each
 * written once, as a body name##_w (always inlined), and compiled twice by INSTANCES, once per width:
 * name##_64 and name##_128. BY_WIDTH(name, w, ...) calls the instance of width w. The engine chooses the
 * loop's instance once a call (serve); inside it w is a constant, each width test is folded away and each
 * instance holds one width's code, where the list's width was tested per operation (the four policy passes
 * of the 460 MB trace 256 -> 252 ms, 8 of 9 alternated pairs). The rare paths (misses, flushes, GC,
 * expandable segments) and the import and export pass E->w and test it. */
#define INSTANCES(ret, name, params, ...)                                                   \
    static __attribute__((noinline)) ret name##_64 params { return name##_w(__VA_ARGS__, 1); } \
    static __attribute__((noinline)) ret name##_128 params { return name##_w(__VA_ARGS__, 0); }
#define BY_WIDTH(name, w, ...) ((w) ? name##_64(__VA_ARGS__) : name##_128(__VA_ARGS__))

/* A key of width w, held in a u128 either way. */
AI u128 ckey(const Chunk *ch, int j, int w) { return w ? ch->key64[j] : ch->key[j]; }
AI void ckey_set(Chunk *ch, int j, u128 key, int w) {
    if (w)
        ch->key64[j] = (uint64_t)key;
    else
        ch->key[j] = key;
}
AI u128 lkey(const FList *f, size_t c, int w) { return w ? ((const uint64_t *)f->last)[c] : ((const u128 *)f->last)[c]; }
AI void lkey_set(FList *f, size_t c, u128 key, int w) {
    if (w)
        ((uint64_t *)f->last)[c] = (uint64_t)key;
    else
        ((u128 *)f->last)[c] = key;
}
AI u128 kmax(int w) { return w ? KMAX64 : KMAX; }
AI size_t key_bytes(int w) { return w ? sizeof(uint64_t) : sizeof(u128); }

/* Block k's key in list f, into *out; -1 with E->misfit set where a 64-bit key would not be exact. */
AI int bkey(Engine *E, FList *f, int32_t k, u128 *out, int w) {
    int64_t size = E->b[k].size, addr = E->b[k].addr;
    if (!w) {
        *out = pack_key(E->key_mul, size, addr);
        return 0;
    }
    if (!f->based) { /* the first block's window: 2**44 below it, 2**46 long, ending at 2**sh at most */
        f->based = 1;
        f->base = addr - ((int64_t)1 << 44);
        int64_t top = E->sh >= 62 ? VMAX : (int64_t)1 << E->sh;
        f->span = top - f->base < ((int64_t)1 << 46) ? top - f->base : (int64_t)1 << 46;
        if (f->span < 0) f->span = 0;
    }
    uint64_t off = (uint64_t)(addr - f->base);
    if (((size | addr | f->base) & 511) | (off >= (uint64_t)f->span) | ((uint64_t)size >> 9 >= K64_SIZES)) {
        E->misfit = 1;
        return -1;
    }
    *out = ((uint64_t)size >> 9 << K64_ADDR) | (off >> 9);
    return 0;
}

/* The key a search for blocks of at least size starts at (address part 0): exact in 64 bits too, where
 * every key's size is a multiple of 512 (ceil(size / 512)), and a size past every key that fits searches
 * past them all (KMAX64). */
AI u128 size_key(const Engine *E, i128 size, int w) {
    if (!w) return (u128)size << E->sh;
    i128 code = (size + 511) >> 9;
    return code >= (i128)K64_SIZES ? KMAX64 : (uint64_t)code << K64_ADDR;
}

/* A key's size, either width. */
AI int64_t fkey_size(const Engine *E, u128 key, int w) {
    return w ? (int64_t)((uint64_t)key >> K64_ADDR << 9) : key_size(E->sh, key);
}

/* The 128-bit key (Python's) of a key of f: a 64-bit one rebuilt exactly. */
static inline u128 full_key(const Engine *E, const FList *f, u128 key, int w) {
    if (!w) return key;
    uint64_t k = (uint64_t)key;
    return pack_key(E->key_mul, (int64_t)(k >> K64_ADDR << 9),
                    f->base + (int64_t)((k & (((uint64_t)1 << K64_ADDR) - 1)) << 9));
}

static inline int pos_ok(const FList *f, Pos p) { return p.c >= 0 && (size_t)p.c < f->nc; }
AI u128 pos_key(const FList *f, Pos p, int w) { return ckey(f->c[p.c], p.j, w); }
static inline int32_t pos_blk(const FList *f, Pos p) { return f->c[p.c]->blk[p.j]; }

static inline void pos_next(const FList *f, Pos *p) {
    if (++p->j >= f->c[p->c]->n) {
        p->c++;
        p->j = 0;
    }
}

static inline void pos_prev(const FList *f, Pos *p) { /* from the end too; before the first: c -1 */
    if (p->j > 0) {
        p->j--;
    } else if (--p->c >= 0) {
        p->j = f->c[p->c]->n - 1;
    }
}

/* bisect_left over FCAP sorted keys (KMAX at the end where fewer): how many are below key. Halvings
 * without a branch (a compare sets the step) down to eight keys, counted: the count's compares run
 * side by side, where each halving waits for the one before. */
AI int below(const void *a, size_t i, u128 key, int hi_only, int w) {
    if (w) return ((const uint64_t *)a)[i] < (uint64_t)key;
    u128 k = ((const u128 *)a)[i];
    return hi_only ? (uint64_t)(k >> 64) < (uint64_t)(key >> 64) : k < key;
}

/* How many of the eight keys at first, first + stride, ... are below key. hi_only (a constant where
 * inlined): key's low half is 0, so a key is below it exactly when its high half is: one 64-bit compare
 * each (an allocation's search key, size << sh, where the size is a multiple of 2**(64 - sh), as rounded
 * sizes are). The compares' carries summed in two chains of four, not the compiler's one of eight: the
 * count is on every search's path of dependent loads (with fl_chunk_by's stride, the four policy passes
 * of the 460 MB trace ~253 -> ~241 ms). */
AI size_t count8(const void *a, size_t first, size_t stride, u128 key, int hi_only, int w) {
    size_t c0 = 0, c1 = 0;
    for (size_t i = 0; i < 8; i += 2) {
        c0 += (size_t)below(a, first + i * stride, key, hi_only, w);
        c1 += (size_t)below(a, first + (i + 1) * stride, key, hi_only, w);
    }
    __asm__("" : "+r"(c0), "+r"(c1)); /* kept apart: the compiler would chain the eight again */
    return c0 + c1;
}

AI size_t lowerF(const void *a, u128 key, int hi_only, int w) {
    size_t b = 0;
    for (size_t half = FCAP / 2; half >= 8; half >>= 1) b += (size_t)below(a, b + half - 1, key, hi_only, w) * half;
    return b + count8(a, b, 1, key, hi_only, w);
}

AI const void *chunk_keys(const Chunk *ch, int w) { return w ? (const void *)ch->key64 : (const void *)ch->key; }
AI const void *last_from(const FList *f, size_t b, int w) {
    return w ? (const void *)((const uint64_t *)f->last + b) : (const void *)((const u128 *)f->last + b);
}

/* The first chunk whose last key is >= key (nc: none), over the capl (a power of two) last keys:
 * halvings down to 64 of them, eight counted at a stride of an eighth (where more than FCAP are left),
 * then the eight from there (lowerF): two counts of eight keys side by side, where halvings from 64 down
 * to 8 are three compares each waiting on the last. The final eight may pass capl, into LAST_PAD's KMAX
 * (where every strided key was below key), and may hold more than the stride left: those are not below
 * key (the keys are in order, and the strided count ended at one that is not). capl changes rarely: the
 * lengths are learnt. */
AI Py_ssize_t fl_chunk_by(const FList *f, u128 key, int hi_only, int w) {
    size_t b = 0, span = f->capl;
    for (; span > 64; span >>= 1) b += (size_t)below(f->last, b + span / 2 - 1, key, hi_only, w) * (span / 2);
    if (span > FCAP) {
        size_t s = span >> 3;
        b += s * count8(f->last, b + s - 1, s, key, hi_only, w);
    }
    return (Py_ssize_t)(b + lowerF(last_from(f, b, w), key, hi_only, w));
}

AI int in_chunk(const Chunk *ch, u128 key, int w) { return (int)lowerF(chunk_keys(ch, w), key, 0, w); }

AI Pos fl_lower_by(const FList *f, u128 key, int hi_only, int w) {
    Pos p = {0, 0};
    if (!f->nc) return p;
    p.c = fl_chunk_by(f, key, hi_only, w);
    if ((size_t)p.c < f->nc) p.j = (int)lowerF(chunk_keys(f->c[p.c], w), key, hi_only, w);
    return p;
}

/* bisect_left: the first entry whose key is >= key; a 128-bit key whose low half is 0 searched on the
 * high halves alone (lowerF). */
AI Pos fl_lower(const FList *f, u128 key, int w) {
    if (w) return fl_lower_by(f, key, 0, 1);
    return (uint64_t)key ? fl_lower_by(f, key, 0, 0) : fl_lower_by(f, key, 1, 0);
}

/* FCAP entries of a chunk (keys and blocks) one place on, from src to dst = src -/+ 1: copied out whole
 * and back, fixed lengths the compiler moves inline, where two calls of memmove (overlapping ranges)
 * took 6% of the report's samples: the four policy passes 442 -> 398 ms (5 alternated pairs). */
AI void move_entries(Chunk *ch, int dst, int src, int w) {
    int32_t b[FCAP];
    if (w) {
        uint64_t k[FCAP];
        memcpy(k, ch->key64 + src, sizeof k);
        memcpy(ch->key64 + dst, k, sizeof k);
    } else {
        u128 k[FCAP];
        memcpy(k, ch->key + src, sizeof k);
        memcpy(ch->key + dst, k, sizeof k);
    }
    memcpy(b, ch->blk + src, sizeof b);
    memcpy(ch->blk + dst, b, sizeof b);
}

/* Entry j out of the chunk: the FCAP entries after it move down one (KMAX comes in at the end, from
 * the upper half where the chunk was full). */
AI void chunk_cut(Chunk *ch, int j, int w) {
    move_entries(ch, j, j + 1, w);
    ch->n--;
}

/* (key, blk) in at entry j of a chunk with room: the FCAP entries from j move up one (the last of
 * them KMAX, into the upper half). */
AI void chunk_add(Chunk *ch, int j, u128 key, int32_t blk, int w) {
    move_entries(ch, j + 1, j, w);
    ckey_set(ch, j, key, w);
    ch->blk[j] = blk;
    ch->n++;
}

static Chunk *chunk_new(FList *f, int w) {
    Chunk *ch = f->spare;
    if (ch) {
        f->spare = NULL;
    } else if (!(ch = PyMem_RawMalloc(sizeof(Chunk)))) {
        return NULL;
    }
    ch->n = 0;
    for (int j = 0; j < 2 * FCAP; j++) ckey_set(ch, j, kmax(w), w);
    return ch;
}

static void chunk_drop(FList *f, Chunk *ch) {
    if (f->spare)
        PyMem_RawFree(ch);
    else
        f->spare = ch;
}

static int chunk_insert_at(FList *f, size_t at, Chunk *ch, int w) {
    size_t kb = key_bytes(w);
    if (grow((void **)&f->c, &f->capc, f->nc + 1, sizeof(Chunk *)) < 0) return -1;
    if (f->nc + 1 > f->capl) { /* doubled, the new half KMAX */
        size_t cap = f->capl ? f->capl * 2 : FCAP;
        if (cap > ((size_t)PY_SSIZE_T_MAX / kb) - LAST_PAD) return -1;
        void *last = PyMem_RawRealloc(f->last, (cap + LAST_PAD) * kb);
        if (!last) return -1;
        f->last = last;
        for (size_t j = f->capl; j < cap + LAST_PAD; j++) lkey_set(f, j, kmax(w), w);
        f->capl = cap;
    }
    memmove(f->c + at + 1, f->c + at, (f->nc - at) * sizeof(Chunk *));
    memmove((char *)f->last + (at + 1) * kb, (char *)f->last + at * kb, (f->nc - at) * kb);
    f->c[at] = ch;
    lkey_set(f, at, ch->n ? ckey(ch, ch->n - 1, w) : 0, w);
    f->nc++;
    return 0;
}

/* Insert at the key's bisect_left place; the block's chunk noted in the arena (Blk.at). */
AI int fl_put_w(FList *f, u128 key, int32_t blk, Blk *arena, int w) {
    if (!f->nc) {
        Chunk *ch = chunk_new(f, w);
        if (!ch) return -1;
        if (chunk_insert_at(f, 0, ch, w) < 0) {
            chunk_drop(f, ch);
            return -1;
        }
    }
    Py_ssize_t c = fl_chunk_by(f, key, 0, w);
    if ((size_t)c == f->nc) c--; /* past every key: the end of the last chunk */
    Chunk *ch = f->c[c];
    if (ch->n == FCAP) { /* split the full chunk in two halves */
        Chunk *hi = chunk_new(f, w);
        if (!hi) return -1;
        hi->n = FCAP / 2;
        for (int j = 0; j < FCAP / 2; j++) ckey_set(hi, j, ckey(ch, FCAP / 2 + j, w), w);
        memcpy(hi->blk, ch->blk + FCAP / 2, (FCAP / 2) * sizeof(int32_t));
        if (chunk_insert_at(f, (size_t)c + 1, hi, w) < 0) {
            chunk_drop(f, hi);
            return -1;
        }
        ch->n = FCAP / 2;
        for (int j = FCAP / 2; j < FCAP; j++) ckey_set(ch, j, kmax(w), w);
        for (int j = 0; j < FCAP / 2; j++) arena[hi->blk[j]].at = (int32_t)c + 1;
        lkey_set(f, (size_t)c, ckey(ch, ch->n - 1, w), w);
        if (lkey(f, (size_t)c, w) < key) { /* its place is in the upper half */
            ch = hi;
            c++;
        }
    }
    chunk_add(ch, in_chunk(ch, key, w), key, blk, w);
    arena[blk].at = (int32_t)c;
    lkey_set(f, (size_t)c, ckey(ch, ch->n - 1, w), w);
    f->n++;
    return 0;
}

INSTANCES(int, fl_put, (FList *f, u128 key, int32_t blk, Blk *arena), f, key, blk, arena)

AI void fl_delete_at(FList *f, Pos p, int w) {
    Chunk *ch = f->c[p.c];
    chunk_cut(ch, p.j, w);
    f->n--;
    if (!ch->n) {
        size_t kb = key_bytes(w);
        chunk_drop(f, ch);
        memmove(f->c + p.c, f->c + p.c + 1, (f->nc - (size_t)p.c - 1) * sizeof(Chunk *));
        memmove((char *)f->last + (size_t)p.c * kb, (char *)f->last + ((size_t)p.c + 1) * kb,
                (f->nc - (size_t)p.c - 1) * kb);
        f->nc--;
        lkey_set(f, f->nc, kmax(w), w);
    } else {
        lkey_set(f, (size_t)p.c, ckey(ch, ch->n - 1, w), w);
    }
}

/* The entry at p replaced by (key, blk) at key's bisect_left place: fl_delete_at(p) then fl_put,
 * without the search over the chunks where key's place is in p's chunk (the usual case: a split's
 * remainder, a block merged with its neighbour, mostly even at the same place): every key of the
 * chunks before is below key, and the next chunk's first key is not. Where the place is another
 * entry, the chunk's entries from j move down one and those from the place up one: two fixed-length
 * moves, no memmove call. */
AI int fl_move(FList *f, Pos p, u128 key, int32_t blk, Blk *arena, int w) {
    Chunk *ch = f->c[p.c];
    int n = ch->n, j = p.j;
    /* whether key's place is in p's chunk, as one branch: each test's parts and both neighbours read
     * whatever the outcome (the chunk's own last key and first key where it has no neighbour there) */
    int first = p.c == 0, final = (size_t)p.c + 1 == f->nc;
    u128 before = lkey(f, (size_t)(p.c - !first), w), after = ckey(f->c[p.c + !final], 0, w);
    if ((n > 1) & (first | (before < key)) & (final | (key <= after))) {
        /* its place among the chunk's other entries; those between it and j move one on */
        int to = in_chunk(ch, key, w) - (ckey(ch, j, w) < key);
        if (to != j) { /* j out, then room at to: two fixed-length moves (move_entries), not memmove calls */
            move_entries(ch, j, j + 1, w);
            move_entries(ch, to + 1, to, w);
        }
        ckey_set(ch, to, key, w);
        ch->blk[to] = blk;
        arena[blk].at = (int32_t)p.c;
        lkey_set(f, (size_t)p.c, ckey(ch, n - 1, w), w);
        return 0;
    }
    fl_delete_at(f, p, w);
    return BY_WIDTH(fl_put, w, f, key, blk, arena);
}

static void fl_clear(FList *f, int w) {
    for (size_t c = 0; c < f->nc; c++) chunk_drop(f, f->c[c]);
    for (size_t c = 0; c < f->nc; c++) lkey_set(f, c, kmax(w), w);
    f->nc = 0;
    f->n = 0;
}

/* The blocks of a free list in order (appended to v). */
static int fl_blocks(const FList *f, Vec *v) {
    for (size_t c = 0; c < f->nc; c++)
        for (int j = 0; j < f->c[c]->n; j++)
            if (vec_push(v, f->c[c]->blk[j]) < 0) return -1;
    return 0;
}

/* A block that went into a free list: state free, its GC age stamped. */
static int now_free(Engine *E, int32_t k) {
    E->b[k].state = ST_FREE;
    if (E->gc_on) TRY(hm_set(&E->gcb, E->b[k].addr, E->gcc, 0));
    return 0;
}

/* _insert: into free list lk at its key's place (bisect_left), state free, GC age stamped. */
AI int fl_insert(Engine *E, int lk, int32_t k, int w) {
    u128 key;
    TRY(bkey(E, &E->fl[lk], k, &key, w));
    TRY(BY_WIDTH(fl_put, w, &E->fl[lk], key, k, E->b));
    return now_free(E, k);
}

/* _remove: bisect_left for the block's key and delete there; Python deletes whatever is there,
 * so anything but this block there is a state the engine does not follow. */
/* Where block k is in chunk ch (among its n entries), or -1. */
static inline int chunk_index(const Chunk *ch, int32_t k) {
#if defined(__SSE2__)
    __m128i kk = _mm_set1_epi32(k);
    unsigned m = 0;
    for (int i = 0; i < FCAP / 4; i++) {
        __m128i eq = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)ch->blk + i), kk);
        m |= (unsigned)_mm_movemask_ps(_mm_castsi128_ps(eq)) << (4 * i);
    }
    m &= (1u << ch->n) - 1;
    return m ? __builtin_ctz(m) : -1;
#else
    for (int j = 0; j < ch->n; j++)
        if (ch->blk[j] == k) return j;
    return -1;
#endif
}

/* _remove's bisect_left for block k's key, where it must find k. First the chunk k was last put in
 * (Blk.at: no search of the keys, one compare of the chunk's blocks; a chunk split or emptied since
 * may have moved it), taken where k is there under its key with no equal key before it, which is
 * what the search would find; else the search. */
AI int fl_find(Engine *E, FList *f, int32_t k, Pos *at, int w) {
    u128 key;
    TRY(bkey(E, f, k, &key, w));
    int32_t c = E->b[k].at;
    if (c >= 0 && (size_t)c < f->nc) {
        const Chunk *ch = f->c[c];
        int j = chunk_index(ch, k);
        if (j >= 0 && ckey(ch, j, w) == key &&
            (j ? ckey(ch, j - 1, w) < key : (c == 0 || lkey(f, (size_t)c - 1, w) < key))) {
            *at = (Pos){c, j};
            return 0;
        }
    }
    Pos p = fl_lower(f, key, w);
    if (!pos_ok(f, p) || pos_blk(f, p) != k) DECLINE(E, "a free list does not hold the block its key names");
    *at = p;
    return 0;
}

static int fl_remove(Engine *E, int lk, int32_t k) { /* the rare paths' */
    Pos p;
    TRY(fl_find(E, &E->fl[lk], k, &p, E->w));
    fl_delete_at(&E->fl[lk], p, E->w);
    E->b[k].state = ST_ALLOC;
    return 0;
}

static Py_ssize_t ul_lower(const UList *u, int64_t addr) {
    Py_ssize_t lo = 0, hi = u->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        if (u->addr[mid] < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int ul_insert(Engine *E, int lk, int32_t k) { /* _uinsert */
    UList *u = &E->ul[lk];
    size_t cap = (size_t)u->cap, cap2 = (size_t)u->cap;
    if (grow((void **)&u->addr, &cap, (size_t)u->n + 1, sizeof(int64_t)) < 0) return -1;
    if (grow((void **)&u->blk, &cap2, (size_t)u->n + 1, sizeof(int32_t)) < 0) return -1;
    u->cap = (Py_ssize_t)(cap < cap2 ? cap : cap2);
    Py_ssize_t j = ul_lower(u, E->b[k].addr);
    memmove(u->addr + j + 1, u->addr + j, (size_t)(u->n - j) * sizeof(int64_t));
    memmove(u->blk + j + 1, u->blk + j, (size_t)(u->n - j) * sizeof(int32_t));
    u->addr[j] = E->b[k].addr;
    u->blk[j] = k;
    u->n++;
    E->b[k].state = ST_UNMAPPED;
    return 0;
}

static int ul_remove(Engine *E, int lk, int32_t k) { /* _uremove */
    UList *u = &E->ul[lk];
    Py_ssize_t j = ul_lower(u, E->b[k].addr);
    if (j >= u->n || u->blk[j] != k) DECLINE(E, "an unmapped list does not hold the range its address names");
    memmove(u->addr + j, u->addr + j + 1, (size_t)(u->n - j - 1) * sizeof(int64_t));
    memmove(u->blk + j, u->blk + j + 1, (size_t)(u->n - j - 1) * sizeof(int32_t));
    u->n--;
    return 0;
}

static int add_size(Engine *E, int64_t *into, int64_t more) {
    if (more < 0 || *into > VMAX - more) DECLINE(E, "a size past the engine's range");
    *into += more;
    return 0;
}

/* ------------------------------------------------------------------ bookkeeping */

static int record(Engine *E, long action, int64_t size) { /* _record */
    if (E->lockstep) {
        size_t j = E->seg_act.n;
        if (j >= (size_t)E->n_rec || E->rec_act[j] != action || E->rec_size[j] != size) E->lockstep = 0;
    }
    TRY(vec_push(&E->seg_act, action));
    TRY(vec_push(&E->seg_size, size));
    return vec_push(&E->seg_idx, E->cur);
}

static void grew(Engine *E, int64_t by) {
    E->reserved += by;
    if (E->reserved > E->peak) E->peak = E->reserved;
}

/* ------------------------------------------------------------------ placement (placement.py) */

static int va_insert(Engine *E, size_t k, int64_t addr, int64_t size) {
    if (grow((void **)&E->va_free, &E->va_cap, E->va_n + 1, sizeof(Range)) < 0) return -1;
    memmove(E->va_free + k + 1, E->va_free + k, (E->va_n - k) * sizeof(Range));
    E->va_free[k] = (Range){addr, size};
    E->va_n++;
    return 0;
}

static void va_delete(Engine *E, size_t k) {
    memmove(E->va_free + k, E->va_free + k + 1, (E->va_n - k - 1) * sizeof(Range));
    E->va_n--;
}

/* DriverPlacement._give_back: merge with the free ranges after and before, insort. */
static int va_give_back(Engine *E, int64_t addr, int64_t size) {
    size_t k = 0, hi = E->va_n; /* bisect_left(free, (addr, 0)) */
    while (k < hi) {
        size_t mid = (k + hi) >> 1;
        if (E->va_free[mid].addr < addr || (E->va_free[mid].addr == addr && E->va_free[mid].size < 0))
            k = mid + 1;
        else
            hi = mid;
    }
    if (k < E->va_n && E->va_free[k].addr == addr + size) {
        size += E->va_free[k].size;
        va_delete(E, k);
    }
    if (k > 0 && E->va_free[k - 1].addr + E->va_free[k - 1].size == addr) {
        addr = E->va_free[k - 1].addr;
        size += E->va_free[k - 1].size;
        va_delete(E, k - 1);
    }
    /* insort((addr, size)): after equal tuples */
    size_t lo = 0;
    hi = E->va_n;
    while (lo < hi) {
        size_t mid = (lo + hi) >> 1;
        Range r = E->va_free[mid];
        if (addr < r.addr || (addr == r.addr && size < r.size))
            hi = mid;
        else
            lo = mid + 1;
    }
    return va_insert(E, lo, addr, size);
}

static int cmp_range(const void *a, const void *b) {
    const Range *x = a, *y = b;
    if (x->addr != y->addr) return x->addr < y->addr ? -1 : 1;
    return x->size < y->size ? -1 : x->size > y->size;
}

/* PLACEMENTS[kind](self._segment_spans()): the placement model, continuing from the live segments. */
static int va_make(Engine *E) {
    Range *spans = PyMem_RawMalloc((E->heads.n ? E->heads.n : 1) * sizeof(Range));
    if (!spans) {
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < E->heads.cap; i++) {
        if (!E->heads.e[i].used) continue;
        int64_t size = 0;
        for (int32_t b = (int32_t)E->heads.e[i].val; b >= 0; b = E->b[b].next) {
            if (add_size(E, &size, E->b[b].size) < 0) {
                PyMem_RawFree(spans);
                return -1;
            }
        }
        if (E->heads.e[i].key < 0) { /* Python's % and C's differ below zero; no model makes one */
            PyMem_RawFree(spans);
            DECLINE(E, "a segment below address 0");
        }
        spans[n++] = (Range){E->heads.e[i].key, size};
    }
    if (E->kind_mirror) {
        E->va = 1;
        E->va_next = E->top;
        if (n) {
            E->va_next = INT64_MIN;
            for (size_t k = 0; k < n; k++)
                if (spans[k].addr + spans[k].size > E->va_next) E->va_next = spans[k].addr + spans[k].size;
        }
        PyMem_RawFree(spans);
        return 0;
    }
    E->va = 0;
    qsort(spans, n, sizeof(Range), cmp_range);
    if (!n) {
        E->va_low = E->top;
        PyMem_RawFree(spans);
        return 0;
    }
    E->va_low = spans[0].addr - spans[0].addr % E->chunk;
    int64_t end = E->va_low;
    for (size_t k = 0; k < n; k++) {
        if (spans[k].addr > end && va_insert(E, E->va_n, end, spans[k].addr - end) < 0) {
            PyMem_RawFree(spans);
            return -1;
        }
        if (spans[k].addr + spans[k].size > end) end = spans[k].addr + spans[k].size;
    }
    PyMem_RawFree(spans);
    return 0;
}

/* va.place(size) */
static int va_place(Engine *E, int64_t size, int64_t *out) {
    E->counts[C_PLACED]++;
    if (E->va == 1) { /* MirrorPlacement */
        *out = E->va_next;
        if (E->va_next > VMAX - size) DECLINE(E, "an address past the engine's range");
        E->va_next += size;
        return 0;
    }
    for (size_t k = 0; k < E->va_n; k++) { /* DriverPlacement: the lowest free range that holds it */
        Range r = E->va_free[k];
        if (r.size >= size) {
            if (r.size == size)
                va_delete(E, k);
            else
                E->va_free[k] = (Range){r.addr + size, r.size - size};
            *out = r.addr;
            return 0;
        }
    }
    int64_t chunk = size / E->chunk + (size % E->chunk != 0);
    if (chunk > VMAX / E->chunk) DECLINE(E, "an address past the engine's range");
    chunk *= E->chunk;
    E->va_low -= chunk;
    if (E->va_low < 0) DECLINE(E, "an address past the engine's range");
    if (chunk > size) TRY(va_give_back(E, E->va_low + size, chunk - size));
    *out = E->va_low;
    return 0;
}

/* _freed: a cudaMalloc'd segment goes back to the driver. */
static int freed(Engine *E, int32_t b) {
    Py_ssize_t i = hm_find(&E->heads, E->b[b].addr);
    if (i < 0) DECLINE(E, "a released segment is no segment head");
    hm_del_at(&E->heads, (size_t)i);
    if (E->va == 0) TRY(va_give_back(E, E->b[b].addr, E->b[b].size));
    return 0;
}

/* ------------------------------------------------------------------ malloc */

/* The block's entry stays in the list, at *at: the caller takes it out (take), or moves it to its
 * split remainder's key (split). *bsize: the block's size, read off its key (exact at either width). */
AI int get_free_block(Engine *E, int lk, int64_t size, int32_t *out, int64_t *bsize, Pos *at, int w) {
    *out = -1;
    if (E->gc_on && lk / E->ns == 1) E->gcc++;
    FList *f = &E->fl[lk];
    Pos i = fl_lower(f, size_key(E, size, w), w);
    if (!pos_ok(f, i)) return 0;
    if (E->exp) { /* best fit by "free block + the unmapped range after it" (_grown) */
        int32_t c = pos_blk(f, i), nb = E->b[c].next;
        i128 cur = E->b[c].size + (nb >= 0 && E->b[nb].state == ST_UNMAPPED ? E->b[nb].size : 0);
        for (Pos q = i;;) {
            pos_next(f, &q);
            if (!pos_ok(f, q)) break;
            c = pos_blk(f, q);
            nb = E->b[c].next;
            i128 nxt = E->b[c].size + (nb >= 0 && E->b[nb].state == ST_UNMAPPED ? E->b[nb].size : 0);
            if (nxt >= cur) break;
            i = q;
            cur = nxt;
        }
    }
    /* the max_split_size filter: config.fit_limit */
    int64_t limit = size < E->fit_mss ? E->fit_mss : size + E->fit_nsr;
    *bsize = fkey_size(E, pos_key(f, i, w), w);
    if (*bsize >= limit) return 0;
    *out = pos_blk(f, i);
    *at = i;
    return 0;
}

/* free_block: merge with free neighbours, back into the free list; the merged block. The
 * neighbours' entries leave the list in _remove's order (the one before, then the one after), and the
 * last one found is moved to the merged block's key (fl_move: one shift where both are in a chunk). */
AI int free_block_w(Engine *E, int lk, int32_t b, int32_t *out, int w) {
    FList *f = &E->fl[lk];
    Pos at;
    int found = 0; /* at: the entry of a merged neighbour, still in the list */
    int32_t p = E->b[b].prev;
    if (p >= 0 && E->b[p].state == ST_FREE) {
        TRY(fl_find(E, f, p, &at, w));
        found = 1;
        int32_t n = E->b[b].next;
        E->b[p].next = n;
        link_prev(E, n, p);
        TRY(add_size(E, &E->b[p].size, E->b[b].size));
        TRY(kill_block(E, b));
        b = p;
    }
    int32_t n = E->b[b].next;
    if (n >= 0 && E->b[n].state == ST_FREE) {
        if (found) fl_delete_at(f, at, w);
        TRY(fl_find(E, f, n, &at, w));
        found = 1;
        int32_t nn = E->b[n].next;
        E->b[b].next = nn;
        link_prev(E, nn, b);
        TRY(add_size(E, &E->b[b].size, E->b[n].size));
        TRY(kill_block(E, n));
    }
    if (found) {
        u128 key;
        TRY(bkey(E, f, b, &key, w));
        TRY(fl_move(f, at, key, b, E->b, w));
        TRY(now_free(E, b));
    } else {
        TRY(fl_insert(E, lk, b, w));
    }
    if (out) *out = b;
    return 0;
}

INSTANCES(int, free_block, (Engine *E, int lk, int32_t b, int32_t *out), E, lk, b, out)

/* should_split + alloc_found_block (the split rule's two numbers per free list: config.split_rule).
 * at: where b's own entry still is in the free list (get_free_block's find), or NULL (a block from
 * a new segment or mapped pages, in no list): b leaves the list, and the remainder goes into it at
 * its key's place; the one shift of fl_move where both are in one chunk. bsize: b's size (from its key,
 * where get_free_block found it: the split's test then waits on no load of the block). */
AI int split(Engine *E, int lk, int32_t b, int64_t bsize, int64_t size, const Pos *at, int w) {
    int64_t rem = bsize - size;
    E->b[b].state = ST_ALLOC;
    if (!(rem > E->over[lk] && size < E->below[lk])) {
        if (at) fl_delete_at(&E->fl[lk], *at, w);
        return 0;
    }
    int32_t n = E->b[b].next;
    int r = new_block(E, rem, E->b[b].addr + size, b, n, ST_FREE);
    if (r < 0) return -1;
    link_prev(E, n, r);
    E->b[b].next = r;
    E->b[b].size = size;
    if (!at) return fl_insert(E, lk, r, w);
    u128 key;
    TRY(bkey(E, &E->fl[lk], r, &key, w));
    TRY(fl_move(&E->fl[lk], *at, key, r, E->b, w));
    return now_free(E, r);
}

static int alloc_expandable(Engine *E, int lk, int64_t size, int32_t *out);

/* alloc_block: a new segment (or mapped pages); -1 in *out when the limit refuses
 * (config.limit_refuses: reserved + alloc_size above the limit). */
static int alloc_block(Engine *E, int lk, int64_t size, int64_t alloc_size, int32_t *out) {
    *out = -1;
    if (E->has_limit && E->reserved + alloc_size > E->limit) return 0;
    if (E->exp) return alloc_expandable(E, lk, size, out);
    size_t j = E->seg_act.n;
    int64_t address;
    if (E->lockstep && j < (size_t)E->n_rec && E->rec_act[j] == E->seg_alloc && E->rec_size[j] == alloc_size) {
        address = E->rec_addr[j];
        E->counts[C_LOCKSTEP_ADDR]++;
    } else {
        if (E->va < 0) TRY(va_make(E));
        TRY(va_place(E, alloc_size, &address));
    }
    int b = new_block(E, alloc_size, address, -1, -1, ST_ALLOC);
    if (b < 0) return -1;
    TRY(hm_set(&E->heads, address, b, lk));
    grew(E, alloc_size);
    TRY(record(E, E->seg_alloc, alloc_size));
    *out = b;
    return 0;
}

/* release_block: cudaFree a whole free segment. */
static int release_block(Engine *E, int lk, int32_t b) {
    TRY(fl_remove(E, lk, b));
    TRY(freed(E, b));
    E->reserved -= E->b[b].size;
    TRY(record(E, E->seg_free, E->b[b].size));
    return kill_block(E, b);
}

/* release_available_cached_blocks: 1 when it released at least max(size, max_split_size). */
static int release_available(Engine *E, int lk, int64_t size) {
    E->counts[C_AVAIL]++;
    FList *f = &E->fl[lk];
    i128 want = (i128)size > E->mss ? (i128)size : E->mss;
    Pos i = fl_lower(f, size_key(E, want, E->w), E->w);
    if (pos_ok(f, i) && !E->exp) {
        int32_t b = pos_blk(f, i);
        if (E->b[b].prev < 0 && E->b[b].next < 0) {
            E->counts[C_AVAIL_FREED]++;
            TRY(release_block(E, lk, b));
            return 1;
        }
    }
    /* From the entry before i down. Releasing the entry at j leaves every entry before it where it
     * was (a chunk emptied by it goes, and j was then its first entry: the previous one is the last
     * of the chunk before), so stepping back from j stays right. */
    i128 released = 0;
    Pos j = i;
    for (pos_prev(f, &j); released < want && j.c >= 0; pos_prev(f, &j)) {
        int64_t ksize = fkey_size(E, pos_key(f, j, E->w), E->w);
        if ((i128)ksize < E->mss) break;
        int32_t b = pos_blk(f, j);
        if (!E->exp && E->b[b].prev < 0 && E->b[b].next < 0) {
            E->counts[C_AVAIL_FREED]++;
            int emptied = f->c[j.c]->n == 1;
            TRY(release_block(E, lk, b));
            released += (i128)ksize;
            if (emptied) j.j = 0; /* the chunk went: step back into the one before it */
        }
    }
    return released >= want;
}

static int unmap(Engine *E, int lk, int32_t b);

/* _release_pool: release_blocks of one BlockPool, in its (stream, size, address) order. */
static int release_pool(Engine *E, int bp) {
    Vec todo = {0}, all = {0}; /* (lk, block) pairs to unmap, expandable segments; one list's blocks */
    int rc = -1;
    for (int s = 0; s < E->ns; s++) {
        int lk = (int)E->bp_lists[(size_t)bp * E->ns + s];
        FList *f = &E->fl[lk];
        if (!f->n) continue;
        all.n = 0;
        if (fl_blocks(f, &all) < 0) goto out;
        if (E->exp) {
            for (size_t j = 0; j < all.n; j++)
                if (vec_push(&todo, lk) < 0 || vec_push(&todo, all.v[j]) < 0) goto out;
            continue;
        }
        fl_clear(f, E->w); /* and the kept ones back, in the same order */
        for (size_t j = 0; j < all.n; j++) {
            int32_t b = (int32_t)all.v[j];
            if (E->b[b].prev >= 0 || E->b[b].next >= 0) {
                u128 key;
                if (bkey(E, f, b, &key, E->w) < 0 || BY_WIDTH(fl_put, E->w, f, key, b, E->b) < 0) goto out;
                continue;
            }
            E->b[b].state = ST_ALLOC;
            E->counts[C_POOL_FREED]++;
            if (freed(E, b) < 0) goto out;
            E->reserved -= E->b[b].size;
            if (record(E, E->seg_free, E->b[b].size) < 0 || kill_block(E, b) < 0) goto out;
        }
    }
    for (size_t t = 0; t + 1 < todo.n; t += 2)
        if (unmap(E, (int)todo.v[t], (int32_t)todo.v[t + 1]) < 0) goto out;
    rc = 0;
out:
    PyMem_RawFree(todo.v);
    PyMem_RawFree(all.v);
    return rc;
}

/* release_cached_blocks (empty_cache): sync pending frees, free every unsplit segment, unmap free
 * pages; private pools once the trace released them. */
static int release_cached(Engine *E, int64_t upto) {
    E->counts[C_FLUSH]++;
    TRY(vec_push(&E->flushes, E->cur));
    if (E->pend.n) {
        HEnt **order = hm_ordered(&E->pend);
        if (!order) return -1;
        size_t n = E->pend.n;
        Vec pairs = {0};
        int rc = 0;
        for (size_t k = 0; k < n && rc == 0; k++) {
            rc = vec_push(&pairs, order[k]->val);
            if (rc == 0) rc = vec_push(&pairs, order[k]->aux);
        }
        PyMem_RawFree(order);
        for (size_t k = 0; rc == 0 && k + 1 < pairs.n; k += 2) {
            E->counts[C_PEND_SYNCED]++;
            rc = BY_WIDTH(free_block, E->w, E, (int)pairs.v[k + 1], (int32_t)pairs.v[k], NULL);
        }
        PyMem_RawFree(pairs.v);
        TRY(rc);
    }
    hm_clear(&E->pend);
    hm_clear(&E->pmap);
    TRY(release_pool(E, 1)); /* default large pool, then small */
    TRY(release_pool(E, 0));
    for (Py_ssize_t k = 0; k < E->n_freeable; k++) {
        int64_t pool = E->free_pool[k];
        if (E->free_since[k] <= upto && pool * 2 + 1 < E->nbp) {
            E->counts[C_PRIVATE]++;
            TRY(release_pool(E, (int)(pool * 2)));
            TRY(release_pool(E, (int)(pool * 2 + 1)));
        }
    }
    return 0;
}

/* garbage_collect_cached_blocks: free old unsplit segments of the default large pool once reserved
 * memory passes threshold x limit. */
static int garbage_collect(Engine *E) {
    if (E->reserved <= E->gc_threshold) return 0;
    E->counts[C_GC]++;
    i128 target = E->reserved - E->gc_threshold;
    int64_t total_age = 0, count = 0;
    Vec snap = {0};
    for (int s = 0; s < E->ns; s++) {
        snap.n = 0;
        if (fl_blocks(&E->fl[E->bp_lists[(size_t)1 * E->ns + s]], &snap) < 0) goto fail;
        for (size_t j = 0; j < snap.n; j++) {
            int32_t b = (int32_t)snap.v[j];
            if (E->b[b].prev < 0 && E->b[b].next < 0) {
                Py_ssize_t g = hm_find(&E->gcb, E->b[b].addr);
                total_age += E->gcc - (g >= 0 ? E->gcb.e[g].val : 0);
                count++;
            }
        }
    }
    if (count == 0) goto done;
    /* Python's int / int is the correctly rounded double: the same in C while both are exact doubles. */
    if (total_age >= ((int64_t)1 << 53) || total_age <= -((int64_t)1 << 53) || E->gcc >= ((int64_t)1 << 53)) {
        E->declined = "GC ages past exact doubles";
        goto fail;
    }
    i128 reclaimed = 0;
    int any = 1;
    while (reclaimed < target && any && count > 0) {
        double age_threshold = (double)total_age / (double)count;
        any = 0;
        for (int s = 0; s < E->ns; s++) {
            int lk = (int)E->bp_lists[(size_t)1 * E->ns + s];
            FList *f = &E->fl[lk];
            snap.n = 0; /* for b in list(self.blks[lk]) */
            if (fl_blocks(f, &snap) < 0) goto fail;
            for (size_t j = 0; j < snap.n; j++) {
                int32_t b = (int32_t)snap.v[j];
                if (E->b[b].prev >= 0 || E->b[b].next >= 0 || E->exp) continue;
                Py_ssize_t g = hm_find(&E->gcb, E->b[b].addr);
                int64_t age = E->gcc - (g >= 0 ? E->gcb.e[g].val : 0);
                if ((double)age >= age_threshold) {
                    any = 1;
                    reclaimed += E->b[b].size;
                    total_age -= age;
                    count--;
                    E->counts[C_GC_FREED]++;
                    if (release_block(E, lk, b) < 0) goto fail;
                }
            }
        }
    }
done:
    PyMem_RawFree(snap.v);
    return 0;
fail:
    PyMem_RawFree(snap.v);
    return -1;
}

/* miss: malloc after get_free_block missed: GC, new segment, flushes; -1 in *out: OOM. */
static int miss(Engine *E, int lk, int64_t size, int64_t alloc_size, int32_t *out) {
    E->counts[C_MISS]++;
    if (E->gc_on) TRY(garbage_collect(E));
    TRY(alloc_block(E, lk, size, alloc_size, out));
    if (*out < 0 && E->mss_on) {
        int r = release_available(E, lk, size);
        TRY(r);
        if (r) TRY(alloc_block(E, lk, size, alloc_size, out));
    }
    /* A request into a private pool means a capture is underway: no flush then. */
    if (*out < 0 && lk / E->ns < 2) {
        TRY(release_cached(E, E->cur));
        TRY(alloc_block(E, lk, size, alloc_size, out));
    }
    return 0;
}

/* ------------------------------------------------------------------ expandable segments */

static inline int64_t ceil_to(int64_t x, int64_t page) { return (x / page + (x % page != 0)) * page; }

/* find_expandable_block: lowest address where free + unmapped space fits, else a new reservation. */
static int find_expandable(Engine *E, int lk, int64_t size, int32_t *out) {
    UList *u = &E->ul[lk];
    for (Py_ssize_t j = 0; j < u->n; j++) {
        int32_t c = u->blk[j], p = E->b[c].prev;
        if (p >= 0 && E->b[p].state == ST_FREE) c = p;
        i128 total = 0;
        for (int32_t b = c; total < size && b >= 0 && E->b[b].state != ST_ALLOC; b = E->b[b].next)
            total += E->b[b].size;
        if (total >= size) {
            *out = c;
            return 0;
        }
    }
    int64_t page = E->page[lk];
    int64_t base = E->next_resv;
    if (E->next_resv > VMAX - E->resv_stride) DECLINE(E, "an address past the engine's range");
    E->next_resv += E->resv_stride;
    E->counts[C_RESERVATION]++;
    int r = new_block(E, ceil_to(E->resv_bytes, page), base, -1, -1, ST_UNMAPPED);
    if (r < 0) return -1;
    TRY(ul_insert(E, lk, r));
    TRY(hm_set(&E->heads, base, r, lk));
    *out = r;
    return 0;
}

/* map_block: map whole pages at the start of unmapped range u; merge. */
static int map_pages(Engine *E, int lk, int32_t u, int64_t size, int32_t *out) {
    if (u < 0 || E->b[u].state != ST_UNMAPPED) DECLINE(E, "mapping a range that is not unmapped");
    E->counts[C_MAP]++;
    int64_t page = E->page[lk];
    int64_t mapped = ceil_to(size, page);
    TRY(ul_remove(E, lk, u));
    if (mapped < E->b[u].size) {
        int32_t n = E->b[u].next;
        int r = new_block(E, E->b[u].size - mapped, E->b[u].addr + mapped, u, n, ST_UNMAPPED);
        if (r < 0) return -1;
        link_prev(E, n, r);
        E->b[u].next = r;
        E->b[u].size = mapped;
        TRY(ul_insert(E, lk, r));
    }
    /* The newly mapped pages are a free block like any other: merge as a free does. */
    E->b[u].state = ST_ALLOC;
    TRY(BY_WIDTH(free_block, E->w, E, lk, u, out));
    grew(E, mapped);
    return record(E, E->seg_map, mapped);
}

/* try_allocate_expandable_block: map pages until a free block of size. */
static int alloc_expandable(Engine *E, int lk, int64_t size, int32_t *out) {
    int32_t c;
    TRY(find_expandable(E, lk, size, &c));
    if (E->b[c].state == ST_UNMAPPED) TRY(map_pages(E, lk, c, E->b[c].size < size ? E->b[c].size : size, &c));
    while (E->b[c].size < size) {
        int32_t n = E->b[c].next;
        if (n < 0) DECLINE(E, "an expandable block with nothing after it to map");
        int64_t want = size - E->b[c].size;
        TRY(map_pages(E, lk, n, want < E->b[n].size ? want : E->b[n].size, &c));
    }
    TRY(fl_remove(E, lk, c));
    *out = c;
    return 0;
}

/* unmap_block: unmap the whole pages strictly inside free block b. */
static int unmap(Engine *E, int lk, int32_t b) {
    int64_t page = E->page[lk];
    int64_t a = E->b[b].addr;
    int64_t base = a - a % E->resv_stride;
    int64_t start = a - base, end = start + E->b[b].size;
    int64_t first = start / page + (start % page != 0), last = end / page;
    if (first >= last) return 0;
    E->counts[C_UNMAP]++;
    TRY(fl_remove(E, lk, b));
    int32_t nxt = E->b[b].next, u;
    int64_t ustart = base + first * page, usize = (last - first) * page, after = end - last * page;
    if (ustart > a) { /* a free mapped piece stays before the unmapped range */
        E->b[b].size = ustart - a;
        u = new_block(E, usize, ustart, b, -1, ST_UNMAPPED);
        if (u < 0) return -1;
        E->b[b].next = u;
        TRY(fl_insert(E, lk, b, E->w));
    } else {
        u = b;
        E->b[u].size = usize;
        E->b[u].state = ST_UNMAPPED;
    }
    if (after > 0) {
        int w = new_block(E, after, ustart + usize, u, nxt, ST_FREE);
        if (w < 0) return -1;
        link_prev(E, nxt, w);
        E->b[u].next = w;
        TRY(fl_insert(E, lk, w, E->w));
    } else {
        E->b[u].next = nxt;
        link_prev(E, nxt, u);
    }
    int32_t p = E->b[u].prev;
    if (p >= 0 && E->b[p].state == ST_UNMAPPED) { /* merge into the unmapped range before */
        int32_t n = E->b[u].next;
        E->b[p].next = n;
        link_prev(E, n, p);
        TRY(add_size(E, &E->b[p].size, usize));
        TRY(kill_block(E, u));
        u = p;
    } else {
        TRY(ul_insert(E, lk, u));
    }
    int32_t n = E->b[u].next;
    if (n >= 0 && E->b[n].state == ST_UNMAPPED) {
        TRY(ul_remove(E, lk, n));
        int32_t nn = E->b[n].next;
        E->b[u].next = nn;
        link_prev(E, nn, u);
        TRY(add_size(E, &E->b[u].size, E->b[n].size));
        TRY(kill_block(E, n));
    }
    E->reserved -= usize;
    TRY(record(E, E->seg_unmap, usize));
    if (E->b[u].prev < 0 && E->b[u].next < 0) { /* the whole reservation is unmapped: give it back */
        TRY(ul_remove(E, lk, u));
        Py_ssize_t i = hm_find(&E->heads, E->b[u].addr);
        if (i < 0) DECLINE(E, "a given-back reservation is no segment head");
        hm_del_at(&E->heads, (size_t)i);
        TRY(kill_block(E, u));
    }
    return 0;
}

/* ------------------------------------------------------------------ the request stream */

typedef struct {
    const int64_t *events, *raddrs, *sizes, *lks;
    const int8_t *ops; /* one byte a request: the codes are 0..5 (requests.py's _OP_*), and the column is made so */
    Py_ssize_t n;
} Inputs;

/* allocation_size(size): config.py's own function, asked once per request size before the loop
 * (size_table, for the sizes check_inputs found), since the loop calls no Python: it runs without the
 * GIL, beside other threads. */
static int ask_allocation_size(Engine *E, int64_t size) {
    PyObject *s = PyLong_FromLongLong(size);
    if (!s) return -1;
    PyObject *r = PyObject_CallOneArg(E->allocation_size, s);
    Py_DECREF(s);
    if (!r) return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(r, &overflow);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < 0 || v >= VMAX) DECLINE(E, "an allocation size past the engine's range");
    return hm_set(&E->asz, size, v, 0);
}

/* The allocation size of each request size check_inputs found (in the order they first came), into
 * the table where it left them unanswered. */
static int size_table(Engine *E, const Vec *sizes) {
    for (size_t j = 0; j < sizes->n; j++) TRY(ask_allocation_size(E, sizes->v[j]));
    return 0;
}

static int alloc_size_of(Engine *E, int64_t size, int64_t *out) {
    Py_ssize_t i = hm_find(&E->asz, size);
    if (i < 0) DECLINE(E, "a request size missing from the size table"); /* size_table asked every one */
    *out = E->asz.e[i].val;
    return 0;
}

static int is_transient(const Engine *E, int64_t ev) {
    Py_ssize_t lo = 0, hi = E->n_transient;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        if (E->transient[mid] < ev)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < E->n_transient && E->transient[lo] == ev;
}

/* amap.pop(ra) for request k (ra: its address, read only where there is no pairing): 1 and the block when present. Where the requests are paired (E->sid), the
 * entry is the slot of the alloc that k frees: amap[ra] is that alloc's block where it was served, and
 * nothing where it failed or no alloc at ra is open (scan_requests: every alloc's address was closed by a
 * free since the alloc before it there, and the model's amap was empty: nothing else puts an entry). */
static inline int amap_pop(Engine *E, const Inputs *in, Py_ssize_t k, int64_t *val) {
    if (!E->sid) return hm_pop(&E->amap, in->raddrs[k], val, NULL);
    int32_t s = E->sid[k];
    if (s < 0) return 0;
    *val = E->slot_blk[s];
    E->slot_blk[s] = -1;
    return *val >= 0;
}

/* amap[ra] = b for alloc request k (a new key: the alloc before it at ra was popped). */
static inline int amap_put(Engine *E, const Inputs *in, Py_ssize_t k, int32_t b) {
    if (!E->sid) return hm_set(&E->amap, in->raddrs[k], b, 0);
    int32_t s = E->sid[k];
    E->slot_blk[s] = b;
    E->slot_req[s] = k;
    return 0;
}

static int cmp_slot(const void *a, const void *b) {
    Py_ssize_t x = ((const Py_ssize_t *)a)[0], y = ((const Py_ssize_t *)b)[0];
    return x < y ? -1 : x > y;
}

/* The slots' live entries into amap in the order their allocs came: a Python dict's order of their keys,
 * each put there new (amap_put). */
static int slots_to_amap(Engine *E, const Inputs *in) {
    Py_ssize_t *live = PyMem_RawMalloc(((size_t)E->nslots + 1) * 2 * sizeof(Py_ssize_t));
    if (!live) return -1;
    size_t n = 0;
    for (int32_t s = 0; s < E->nslots; s++)
        if (E->slot_blk[s] >= 0) {
            live[2 * n] = E->slot_req[s];
            live[2 * n + 1] = E->slot_blk[s];
            n++;
        }
    qsort(live, n, 2 * sizeof(Py_ssize_t), cmp_slot);
    int rc = 0;
    for (size_t j = 0; j < n && rc == 0; j++) rc = hm_set(&E->amap, in->raddrs[live[2 * j]], live[2 * j + 1], 0);
    PyMem_RawFree(live);
    return rc;
}

/* The loop: C state only, no Python object touched (its caller has released the GIL); w: the keys' width.
 * A request's address is read only where it is used (not by the allocs and frees the pairing serves), its
 * size only by an allocation: the columns are read once each, from memory, and every column left unread
 * is less streamed past the state the loop keeps in cache. */
AI int serve_w(Engine *E, const Inputs *in, Vec *failed, int w) {
    for (Py_ssize_t k = 0; k < in->n; k++) {
        long op = (long)in->ops[k];
        int lk = (int)in->lks[k];
        int64_t val;
        int32_t aux, b;
        if (op == E->op_free) { /* free_requested + free_completed */
            if (!amap_pop(E, in, k, &val)) continue; /* the model never served this request */
            TRY(BY_WIDTH(free_block, w, E, lk, (int32_t)val, NULL));
        } else if (op == E->op_alloc || op == E->op_oom) {
            if (op == E->op_oom) E->cur = in->events[k];
            int64_t rs = in->sizes[k], bsize;
            Pos at;
            TRY(get_free_block(E, lk, rs, &b, &bsize, &at, w));
            const Pos *from = &at;
            if (b < 0) {
                from = NULL;
                int64_t asz;
                E->cur = in->events[k];
                TRY(alloc_size_of(E, rs, &asz));
                TRY(miss(E, lk, rs, asz, &b));
                if (b < 0) {
                    E->counts[C_OOM_FAILED]++;
                    TRY(vec_push(failed, in->events[k]));
                    continue;
                }
            }
            TRY(split(E, lk, b, from ? bsize : E->b[b].size, rs, from, w));
            if (op == E->op_alloc) {
                TRY(amap_put(E, in, k, b));
            } else if (is_transient(E, E->cur)) { /* an OOM the program caught: freed at once */
                E->counts[C_TRANSIENT]++;
                TRY(BY_WIDTH(free_block, w, E, lk, b, NULL));
            }
        } else if (op == E->op_free_req) { /* freed, but in use on another stream until completed */
            if (!amap_pop(E, in, k, &val)) continue;
            TRY(hm_set(&E->pend, E->b[val].addr, val, lk));
            TRY(hm_set(&E->pmap, in->raddrs[k], val, 0));
        } else if (op == E->op_free_done) {
            if (!hm_pop(&E->pmap, in->raddrs[k], &val, NULL)) continue;
            int64_t pv;
            if (hm_pop(&E->pend, E->b[val].addr, &pv, &aux)) {
                if (pv != val) DECLINE(E, "two pending frees at one address");
                TRY(BY_WIDTH(free_block, w, E, lk, (int32_t)val, NULL));
            }
        } else if (op == E->op_flush) {
            E->cur = in->events[k];
            TRY(release_cached(E, in->raddrs[k]));
        }
    }
    return 0;
}

INSTANCES(int, serve, (Engine *E, const Inputs *in, Vec *failed), E, in, failed)

/* ------------------------------------------------------------------ parameters */

static int get_i128(PyObject *o, i128 *out) {
    if (!PyLong_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "policy_engine: an integer was expected");
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (!overflow) {
        *out = v;
        return 0;
    }
    /* |o| >= 2**63: low 64 bits and the rest, within 2**126 */
    PyObject *sixty4 = PyLong_FromLong(64);
    if (!sixty4) return -1;
    PyObject *hi = PyNumber_Rshift(o, sixty4);
    Py_DECREF(sixty4);
    if (!hi) return -1;
    long long h = PyLong_AsLongLongAndOverflow(hi, &overflow);
    Py_DECREF(hi);
    if (h == -1 && PyErr_Occurred()) return -1;
    if (overflow || h > ((long long)1 << 61) || h < -((long long)1 << 61)) {
        PyErr_SetString(PyExc_OverflowError, "policy_engine: a number past 2**125");
        return -1;
    }
    unsigned long long lo = PyLong_AsUnsignedLongLongMask(o);
    if (lo == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (i128)(((u128)(uint64_t)h << 64) | lo);
    return 0;
}

static PyObject *item(PyObject *d, const char *name) {
    PyObject *o = PyDict_GetItemString(d, name);
    if (!o) PyErr_Format(PyExc_KeyError, "policy_engine: parameter %s missing", name);
    return o;
}

static int p_long(PyObject *d, const char *name, long *out) {
    PyObject *o = item(d, name);
    if (!o) return -1;
    *out = PyLong_AsLong(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int p_i64(PyObject *d, const char *name, int64_t *out) {
    PyObject *o = item(d, name);
    if (!o) return -1;
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

static int p_i128(PyObject *d, const char *name, i128 *out) {
    PyObject *o = item(d, name);
    return o ? get_i128(o, out) : -1;
}

/* An int64 column (a C-contiguous buffer of 8-byte ints); the view is kept in views[]. */
/* A 1-d column of the given width: int64 (8), or int8 (1: the op codes). */
static int p_col_of(PyObject *d, const char *name, Py_ssize_t width, Py_buffer *view, const void **out, Py_ssize_t *n) {
    PyObject *o = item(d, name);
    if (!o) return -1;
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = width == 8 ? !strcmp(f, "q") || !strcmp(f, "l") : !strcmp(f, "b");
    if (view->itemsize != width || view->ndim != 1 || !ok) {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_Format(PyExc_TypeError, "policy_engine: %s must be a 1-d %s array", name, width == 8 ? "int64" : "int8");
        return -1;
    }
    *out = view->buf;
    *n = view->shape[0];
    return 0;
}

static int p_col(PyObject *d, const char *name, Py_buffer *view, const int64_t **out, Py_ssize_t *n) {
    const void *p;
    TRY(p_col_of(d, name, 8, view, &p, n));
    *out = p;
    return 0;
}

/* A threshold that block sizes (in [0, VMAX]: add_size) and their differences with request sizes (in
 * [-VMAX, VMAX]) are compared with, in 64 bits: any number past VMAX + 1 compares with them as VMAX + 1
 * does, and any below -VMAX - 1 as -VMAX - 1, so it is clamped there (fit_limit's "no limit" is far
 * past); a request's size (below VMAX) plus one stays inside int64. */
static int64_t clamped(i128 x) { return x < -VMAX - 1 ? -VMAX - 1 : x > VMAX + 1 ? VMAX + 1 : (int64_t)x; }

static int p_clamped_list(PyObject *d, const char *name, int nl, int64_t **out) {
    PyObject *o = item(d, name);
    if (!o) return -1;
    if (!PyList_Check(o) || PyList_GET_SIZE(o) != nl) {
        PyErr_Format(PyExc_ValueError, "policy_engine: %s must be a list of one number per free list", name);
        return -1;
    }
    *out = PyMem_RawCalloc(nl ? nl : 1, sizeof(int64_t));
    if (!*out) {
        PyErr_NoMemory();
        return -1;
    }
    for (int j = 0; j < nl; j++) {
        i128 x;
        TRY(get_i128(PyList_GET_ITEM(o, j), &x));
        (*out)[j] = clamped(x);
    }
    return 0;
}

enum { V_EVENTS, V_OPS, V_RADDRS, V_SIZES, V_LKS, V_REC_ACT, V_REC_SIZE, V_REC_ADDR, V_PAGE, V_BP, V_FPOOL,
       V_FSINCE, V_TRANSIENT, V_N };

static int parse_params(Engine *E, PyObject *d, Py_buffer *views, Inputs *in) {
    long l;
    const char *names[V_N] = {"events", "ops", "raddrs", "sizes", "lks", "rec_act", "rec_size", "rec_addr",
                              "page", "bp_lists", "freeable_pools", "freeable_since", "transient"};
    const int64_t *cols[V_N];
    Py_ssize_t lens[V_N];
    const void *ops8 = NULL;
    for (int v = 0; v < V_N; v++)
        if (v == V_OPS)
            TRY(p_col_of(d, names[v], 1, &views[v], &ops8, &lens[v]));
        else
            TRY(p_col(d, names[v], &views[v], &cols[v], &lens[v]));
    in->events = cols[V_EVENTS];
    in->ops = ops8;
    in->raddrs = cols[V_RADDRS];
    in->sizes = cols[V_SIZES];
    in->lks = cols[V_LKS];
    in->n = lens[V_OPS];
    if (lens[V_EVENTS] != in->n || lens[V_RADDRS] != in->n || lens[V_SIZES] != in->n || lens[V_LKS] != in->n ||
        lens[V_REC_SIZE] != lens[V_REC_ACT] || lens[V_REC_ADDR] != lens[V_REC_ACT] ||
        lens[V_FSINCE] != lens[V_FPOOL]) {
        PyErr_SetString(PyExc_ValueError, "policy_engine: columns of different lengths");
        return -1;
    }
    E->rec_act = (int64_t *)cols[V_REC_ACT];
    E->rec_size = (int64_t *)cols[V_REC_SIZE];
    E->rec_addr = (int64_t *)cols[V_REC_ADDR];
    E->n_rec = lens[V_REC_ACT];
    E->free_pool = (int64_t *)cols[V_FPOOL];
    E->free_since = (int64_t *)cols[V_FSINCE];
    E->n_freeable = lens[V_FPOOL];
    E->transient = (int64_t *)cols[V_TRANSIENT];
    E->n_transient = lens[V_TRANSIENT];
    E->page = (int64_t *)cols[V_PAGE];
    E->bp_lists = (int64_t *)cols[V_BP];
    TRY(p_long(d, "sh", &l));
    E->sh = (int)l;
    TRY(p_long(d, "ns", &l));
    E->ns = (int)l;
    TRY(p_long(d, "n_lists", &l));
    E->nl = (int)l;
    if (E->sh < 1 || E->sh > 63 || E->ns < 1 || E->nl < 0 || E->nl % (2 * E->ns) || lens[V_PAGE] != E->nl ||
        lens[V_BP] != E->nl) {
        PyErr_SetString(PyExc_ValueError, "policy_engine: inconsistent free-list shape");
        return -1;
    }
    E->nbp = E->nl / E->ns;
    E->key_mul = (uint64_t)1 << E->sh;
    for (int j = 0; j < E->nl; j++)
        if (E->bp_lists[j] < 0 || E->bp_lists[j] >= E->nl || E->page[j] <= 0) {
            PyErr_SetString(PyExc_ValueError, "policy_engine: a free-list index or page out of range");
            return -1;
        }
    const char *flags[] = {"exp", "gc_on", "mss_on", "mirror"};
    int *fdst[] = {&E->exp, &E->gc_on, &E->mss_on, &E->kind_mirror};
    for (int j = 0; j < 4; j++) {
        PyObject *o = item(d, flags[j]);
        if (!o || (*fdst[j] = PyObject_IsTrue(o)) < 0) return -1;
    }
    TRY(p_i128(d, "mss", &E->mss));
    TRY(p_i128(d, "nsr", &E->nsr));
    E->fit_mss = clamped(E->mss);
    E->fit_nsr = clamped(E->nsr);
    PyObject *lim = item(d, "limit");
    if (!lim) return -1;
    E->has_limit = lim != Py_None;
    if (E->has_limit) TRY(get_i128(lim, &E->limit));
    TRY(p_i128(d, "gc_threshold", &E->gc_threshold));
    TRY(p_clamped_list(d, "split_over", E->nl, &E->over));
    TRY(p_clamped_list(d, "split_below", E->nl, &E->below));
    TRY(p_i64(d, "resv_stride", &E->resv_stride));
    TRY(p_i64(d, "resv_bytes", &E->resv_bytes));
    TRY(p_i64(d, "chunk", &E->chunk));
    TRY(p_i64(d, "top", &E->top));
    if (E->resv_stride <= 0 || E->resv_bytes <= 0 || E->chunk <= 0 || E->top < 0 || E->top >= VMAX) {
        PyErr_SetString(PyExc_ValueError, "policy_engine: placement constants out of range");
        return -1;
    }
    const char *codes[] = {"seg_alloc", "seg_free", "seg_map", "seg_unmap", "op_alloc", "op_free",
                           "op_free_req", "op_free_done", "op_oom", "op_flush"};
    long *cdst[] = {&E->seg_alloc, &E->seg_free, &E->seg_map, &E->seg_unmap, &E->op_alloc, &E->op_free,
                    &E->op_free_req, &E->op_free_done, &E->op_oom, &E->op_flush};
    for (int j = 0; j < 10; j++) TRY(p_long(d, codes[j], cdst[j]));
    if (!(E->allocation_size = item(d, "allocation_size"))) return -1;
    return 0;
}

/* The one pass over the requests that their checks and the size table need (scan_requests): the
 * largest free-list index and the bits of every size, as unsigned (a negative one is then past every
 * bound), and the sizes that allocate (each once, in the order they first come); with the requests'
 * pairing (pair_requests) beside it. Three of a report's four policy replays get the very same columns
 * (Requests.columns): compiled.policy_engine keeps this
 * for the columns it read (``scan``) and hands it to each replay of them, which then reads no request
 * before its loop; a replay handed none makes it itself. */
typedef struct {
    uint64_t lk_max, size_bits;
    Vec sizes;
    /* The requests paired (pair_requests; sid NULL: not paired): each alloc's slot, and each free's (a
     * free_requested's too) the slot of the alloc open at its address, else -1; slots [0, nslots). */
    int32_t *sid;
    int32_t nslots;
    int own_sid; /* sid is this scan's to free (else a policy_scan answer's bytes) */
} Scan;

/* Each alloc a slot, free again once a free (or free_requested) at its address closes it, and each such
 * free the slot of the alloc it closes: the engine then keeps amap by slot (amap_pop) instead of hashing
 * every request's address in every replay; a report's replays share this pass (policy_scan). 1 where an
 * alloc comes at an address still open (amap's entry would be overwritten: the maps serve that stream),
 * or past int32 slots; -1 out of memory. */
static int pair_requests(const int8_t *ops, const int64_t *raddrs, Py_ssize_t n, long op_alloc, long op_free,
                         long op_free_req, Scan *out) {
    if (n > INT32_MAX) return 1;
    int32_t *sid = PyMem_RawMalloc((n ? (size_t)n : 1) * sizeof(int32_t));
    HMap open = {0}; /* address -> its open alloc's slot */
    Vec spare = {0}; /* slots free again */
    int32_t nslots = 0;
    int rc = sid ? 0 : -1;
    for (Py_ssize_t k = 0; k < n && rc == 0; k++) {
        long op = (long)ops[k];
        int32_t s = -1;
        if (op == op_alloc) {
            if (hm_find(&open, raddrs[k]) >= 0) {
                rc = 1;
                break;
            }
            s = spare.n ? (int32_t)spare.v[--spare.n] : nslots++;
            if (hm_set(&open, raddrs[k], s, 0) < 0) rc = -1;
        } else if (op == op_free || op == op_free_req) {
            Py_ssize_t i = hm_find(&open, raddrs[k]);
            if (i >= 0) {
                s = (int32_t)open.e[i].val;
                hm_del_at(&open, (size_t)i);
                if (vec_push(&spare, s) < 0) rc = -1;
            }
        }
        sid[k] = s;
    }
    PyMem_RawFree(open.e);
    PyMem_RawFree(spare.v);
    if (rc != 0) {
        PyMem_RawFree(sid);
        return rc;
    }
    out->sid = sid;
    out->nslots = nslots;
    out->own_sid = 1;
    return 0;
}

static int scan_requests(const int8_t *ops, const int64_t *sizes, const int64_t *lks, Py_ssize_t n, long op_alloc,
                         long op_oom, Scan *out) {
    /* The sizes already listed, remembered in a direct-mapped filter (a request's size mostly came
     * before: thousands of sizes over millions of requests) ahead of the table itself, whose lookups
     * cost more. Every request is looked up there, a free's too (its size is an allocation's): the
     * branch is then the filter's, taken rarely, not the request's kind, which alternates. */
    enum { SEEN = 4096 };
    int64_t seen[SEEN];
    for (int j = 0; j < SEEN; j++) seen[j] = -1; /* no size: sizes are >= 0, or bad */
    HMap listed = {0};
    uint64_t lk_max = 0, bits = 0;
    int r = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t size = sizes[k];
        uint64_t lk = (uint64_t)lks[k];
        lk_max = lk > lk_max ? lk : lk_max;
        bits |= (uint64_t)size;
        size_t h = (size_t)(((uint64_t)size * 0x9e3779b97f4a7c15ULL) >> 52);
        if (seen[h] == size) continue;
        long op = (long)ops[k];
        if (op != op_alloc && op != op_oom) continue;
        seen[h] = size;
        if (hm_find(&listed, size) >= 0) continue;
        if (hm_set(&listed, size, 0, 0) < 0 || vec_push(&out->sizes, size) < 0) {
            r = -1;
            break;
        }
    }
    PyMem_RawFree(listed.e);
    out->lk_max = lk_max;
    out->size_bits = bits;
    return r;
}

/* Requests the engine cannot follow as Python would (a free-list index outside the lists, a size
 * outside [0, 2**62)): declined before anything runs, from the scan of the requests; the sizes that
 * allocate go into the size table unanswered (new_sizes; size_table asks their allocation sizes once
 * the model is read). */
static int check_inputs(Engine *E, const Inputs *in, const Scan *scan, Vec *new_sizes) {
    if (in->n && E->nbp < 2) DECLINE(E, "no default pool"); /* the flushes and the GC read pools 0 and 1 */
    if (scan->lk_max >= (uint64_t)E->nl || scan->size_bits >= (uint64_t)VMAX) /* which request, first */
        for (Py_ssize_t k = 0; k < in->n; k++) {
            if (in->lks[k] < 0 || in->lks[k] >= E->nl) DECLINE(E, "a free-list index out of range");
            if (in->sizes[k] < 0 || in->sizes[k] >= VMAX) DECLINE(E, "a size out of range");
        }
    for (size_t j = 0; j < scan->sizes.n; j++) {
        int64_t size = scan->sizes.v[j];
        if (hm_find(&E->asz, size) >= 0) continue;
        TRY(hm_set(&E->asz, size, -1, 0)); /* listed; its value comes from size_table */
        TRY(vec_push(new_sizes, size));
    }
    for (Py_ssize_t k = 0; k < E->n_rec; k++)
        if (E->rec_addr[k] < 0 || E->rec_addr[k] >= VMAX || E->rec_size[k] < 0 || E->rec_size[k] >= VMAX)
            DECLINE(E, "a recorded segment out of range");
    for (Py_ssize_t k = 0; k < E->n_freeable; k++)
        if (E->free_pool[k] < 0) DECLINE(E, "a negative pool id");
    return 0;
}

/* The scan handed in (params' ``scan``: policy_scan's answer for these very columns), or made here
 * where none is (None). Only the answer of policy_scan for the same columns vouches for them: the
 * loop indexes the free lists by the requests' indices, and the slots by the pairing's. */
static int scan_of(Engine *E, PyObject *d, const Inputs *in, Scan *out) {
    PyObject *o = PyDict_GetItemString(d, "scan");
    if (!o || o == Py_None) { /* as policy_scan, without the GIL */
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = scan_requests(in->ops, in->sizes, in->lks, in->n, E->op_alloc, E->op_oom, out);
        if (r == 0) r = pair_requests(in->ops, in->raddrs, in->n, E->op_alloc, E->op_free, E->op_free_req, out);
        Py_END_ALLOW_THREADS
        return r < 0 ? -1 : 0;
    }
    PyObject *lk = NULL, *bits = NULL, *sizes = NULL, *pairs = NULL, *sid = NULL;
    int nslots = 0;
    if (!PyTuple_Check(o) ||
        !PyArg_ParseTuple(o, "O!O!O!O", &PyLong_Type, &lk, &PyLong_Type, &bits, &PyBytes_Type, &sizes, &pairs) ||
        PyBytes_GET_SIZE(sizes) % sizeof(int64_t) ||
        (pairs != Py_None && (!PyTuple_Check(pairs) || !PyArg_ParseTuple(pairs, "iO!", &nslots, &PyBytes_Type, &sid) ||
                              nslots < 0 || PyBytes_GET_SIZE(sid) != in->n * (Py_ssize_t)sizeof(int32_t)))) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "policy_engine: scan must be policy_scan's answer");
        return -1;
    }
    if (sid) { /* the answer's bytes, alive in params for the call */
        out->sid = (int32_t *)PyBytes_AS_STRING(sid);
        out->nslots = nslots;
    }
    out->lk_max = PyLong_AsUnsignedLongLong(lk);
    out->size_bits = PyLong_AsUnsignedLongLong(bits);
    if (PyErr_Occurred()) return -1;
    size_t n = (size_t)PyBytes_GET_SIZE(sizes) / sizeof(int64_t);
    if (grow((void **)&out->sizes.v, &out->sizes.cap, n ? n : 1, sizeof(int64_t)) < 0) return -1;
    memcpy(out->sizes.v, PyBytes_AS_STRING(sizes), n * sizeof(int64_t));
    out->sizes.n = n;
    return 0;
}

/* policy_scan(ops, sizes, lks, raddrs, op_alloc, op_oom, op_free, op_free_req) -> (largest free-list index,
 * the sizes' bits, the sizes that allocate as int64 bytes, the pairing: (slots, each request's slot as
 * int32 bytes) or None where the requests do not pair up): scan_requests and pair_requests, without the
 * GIL. */
PyObject *oomscope_policy_scan(PyObject *self, PyObject *args) {
    Py_buffer ov, sv, lv, av;
    long op_alloc, op_oom, op_free, op_free_req;
    if (!PyArg_ParseTuple(args, "y*y*y*y*llll", &ov, &sv, &lv, &av, &op_alloc, &op_oom, &op_free, &op_free_req))
        return NULL;
    PyObject *result = NULL, *pairs = NULL;
    Py_ssize_t n = ov.len;
    Scan scan = {0};
    int r, paired = 1;
    if (ov.itemsize != 1 || sv.len != n * 8 || lv.len != n * 8 || av.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "policy_scan: int8 ops, int64 sizes, free-list indices and addresses of one length");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    r = scan_requests(ov.buf, sv.buf, lv.buf, n, op_alloc, op_oom, &scan);
    if (r == 0) paired = pair_requests(ov.buf, av.buf, n, op_alloc, op_free, op_free_req, &scan);
    Py_END_ALLOW_THREADS
    if (r < 0 || paired < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (paired == 0)
        pairs = Py_BuildValue("(iy#)", (int)scan.nslots, (const char *)scan.sid, (Py_ssize_t)(n * sizeof(int32_t)));
    else
        pairs = Py_NewRef(Py_None);
    if (!pairs) goto done;
    result = Py_BuildValue("(KKy#N)", (unsigned long long)scan.lk_max, (unsigned long long)scan.size_bits,
                           scan.sizes.v ? (const char *)scan.sizes.v : "", (Py_ssize_t)(scan.sizes.n * sizeof(int64_t)),
                           pairs);
done:
    PyMem_RawFree(scan.sizes.v);
    PyMem_RawFree(scan.sid);
    PyBuffer_Release(&ov);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&lv);
    PyBuffer_Release(&av);
    return result;
}

/* ------------------------------------------------------------------ import (the Python model -> C) */

typedef struct {
    HMap ptr; /* id(block) -> arena index */
    PyObject **objs;
    size_t n, cap;
} Interner;

static int small_int(Engine *E, PyObject *o, int64_t *out) {
    if (!PyLong_CheckExact(o)) DECLINE(E, "a number that is no int");
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < 0 || v >= VMAX) DECLINE(E, "a number out of range");
    *out = v;
    return 0;
}

static int any_int(Engine *E, PyObject *o, int64_t *out) { /* a dict key: any int64 */
    if (!PyLong_CheckExact(o)) DECLINE(E, "a key that is no int");
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow) DECLINE(E, "a key out of range");
    *out = v;
    return 0;
}

/* The arena index of a Python block (a 5-item list), made on first sight; its neighbours are
 * linked afterwards (link_all), without recursion along long segments. */
static int intern(Engine *E, Interner *I, PyObject *o, int32_t *out) {
    Py_ssize_t i = hm_find(&I->ptr, (int64_t)(intptr_t)o);
    if (i >= 0) {
        *out = (int32_t)I->ptr.e[i].val;
        return 0;
    }
    if (!PyList_CheckExact(o) || PyList_GET_SIZE(o) != 5) DECLINE(E, "a block that is no 5-item list");
    PyObject *p = PyList_GET_ITEM(o, 2), *n = PyList_GET_ITEM(o, 3);
    if ((p != Py_None && !PyList_CheckExact(p)) || (n != Py_None && !PyList_CheckExact(n)))
        DECLINE(E, "a block whose neighbours are no blocks");
    int64_t size, addr;
    TRY(small_int(E, PyList_GET_ITEM(o, 0), &size));
    TRY(small_int(E, PyList_GET_ITEM(o, 1), &addr));
    PyObject *st = PyList_GET_ITEM(o, 4);
    int8_t state = st == Py_True ? ST_FREE : st == Py_False ? ST_ALLOC : st == Py_None ? ST_UNMAPPED : ST_DEAD;
    if (state == ST_DEAD) DECLINE(E, "a block state that is not True, False or None");
    int k = new_block(E, size, addr, -1, -1, state);
    if (k < 0) return -1;
    if ((size_t)k != I->n) DECLINE(E, "arena out of step while importing");
    TRY(hm_set(&I->ptr, (int64_t)(intptr_t)o, k, 0));
    if (grow((void **)&I->objs, &I->cap, I->n + 1, sizeof(PyObject *)) < 0) return -1;
    I->objs[I->n++] = o;
    *out = k;
    return 0;
}

/* prev/next of every imported block, interning the blocks only reachable through them. */
static int link_all(Engine *E, Interner *I) {
    for (size_t k = 0; k < I->n; k++) {
        for (int w = 0; w < 2; w++) {
            PyObject *nb = PyList_GET_ITEM(I->objs[k], 2 + w);
            if (nb == Py_None) continue;
            int32_t q;
            TRY(intern(E, I, nb, &q));
            if (w)
                E->b[k].next = q;
            else
                E->b[k].prev = q;
        }
    }
    return 0;
}

static int import_lists(Engine *E, Interner *I, PyObject *model) {
    const char *names[4] = {"keys", "blks", "ukeys", "ublks"};
    PyObject *o[4] = {0};
    int rc = -1;
    for (int j = 0; j < 4; j++) {
        if (!(o[j] = PyObject_GetAttrString(model, names[j]))) goto out;
        if (!PyList_CheckExact(o[j]) || PyList_GET_SIZE(o[j]) != E->nl) {
            E->declined = "free lists of another shape";
            goto out;
        }
    }
    for (int lk = 0; lk < E->nl; lk++) {
        for (int w = 0; w < 2; w++) {
            PyObject *kl = PyList_GET_ITEM(o[2 * w], lk), *bl = PyList_GET_ITEM(o[2 * w + 1], lk);
            if (!PyList_CheckExact(kl) || !PyList_CheckExact(bl) || PyList_GET_SIZE(kl) != PyList_GET_SIZE(bl)) {
                E->declined = "a free list whose keys and blocks differ";
                goto out;
            }
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(bl); j++) {
                int32_t b;
                if (intern(E, I, PyList_GET_ITEM(bl, j), &b) < 0) goto out;
                if (w == 0) {
                    FList *f = &E->fl[lk];
                    u128 key;
                    if (bkey(E, f, b, &key, E->w) < 0) goto out;
                    if (f->nc && lkey(f, f->nc - 1, E->w) >= key) {
                        E->declined = "a free list out of order";
                        goto out;
                    }
                    int8_t st = E->b[b].state;
                    if (fl_insert(E, lk, b, E->w) < 0) goto out; /* appends: the list is sorted */
                    E->b[b].state = st;
                } else {
                    UList *u = &E->ul[lk];
                    if (u->n && u->addr[u->n - 1] >= E->b[b].addr) {
                        E->declined = "an unmapped list out of order";
                        goto out;
                    }
                    int8_t st = E->b[b].state;
                    if (ul_insert(E, lk, b) < 0) goto out;
                    E->b[b].state = st;
                }
            }
        }
    }
    rc = 0;
out:
    for (int j = 0; j < 4; j++) Py_XDECREF(o[j]);
    return rc;
}

/* A dict attribute: {int: block}, {int: (block, lk)} or {int: int} (which = 0, 1, 2). */
static int import_dict(Engine *E, Interner *I, PyObject *model, const char *name, HMap *m, int which) {
    PyObject *d = PyObject_GetAttrString(model, name);
    if (!d) return -1;
    int rc = -1;
    if (!PyDict_CheckExact(d)) {
        E->declined = "a map that is no dict";
        goto out;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v)) {
        int64_t key, val = 0;
        int32_t aux = 0;
        if (any_int(E, k, &key) < 0) goto out;
        if (which == 2) {
            if (!PyLong_CheckExact(v)) {
                E->declined = "a GC age that is no int";
                goto out;
            }
            if (any_int(E, v, &val) < 0) goto out;
        } else {
            PyObject *b = v;
            if (which == 1) {
                if (!PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 2) {
                    E->declined = "a map entry that is no (block, lk)";
                    goto out;
                }
                b = PyTuple_GET_ITEM(v, 0);
                int64_t lk;
                if (small_int(E, PyTuple_GET_ITEM(v, 1), &lk) < 0) goto out;
                if (lk >= E->nl) {
                    E->declined = "a free-list index out of range";
                    goto out;
                }
                aux = (int32_t)lk;
            }
            int32_t bi;
            if (intern(E, I, b, &bi) < 0) goto out;
            val = bi;
        }
        if (hm_set(m, key, val, aux) < 0) goto out;
    }
    rc = 0;
out:
    Py_DECREF(d);
    return rc;
}

static int import_vec(Engine *E, PyObject *model, const char *name, Vec *v) {
    PyObject *l = PyObject_GetAttrString(model, name);
    if (!l) return -1;
    int rc = -1;
    if (!PyList_CheckExact(l)) {
        E->declined = "a record that is no list";
        goto out;
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(l); j++) {
        int64_t x;
        if (any_int(E, PyList_GET_ITEM(l, j), &x) < 0 || vec_push(v, x) < 0) goto out;
    }
    rc = 0;
out:
    Py_DECREF(l);
    return rc;
}

static int import_scalar(Engine *E, PyObject *model, const char *name, int64_t *out) {
    PyObject *o = PyObject_GetAttrString(model, name);
    if (!o) return -1;
    int rc = any_int(E, o, out);
    Py_DECREF(o);
    return rc;
}

static int import_va(Engine *E, PyObject *model) {
    PyObject *va = PyObject_GetAttrString(model, "va");
    if (!va) return -1;
    int rc = -1;
    if (va == Py_None) {
        E->va = -1;
        rc = 0;
        goto out;
    }
    PyObject *free = PyObject_GetAttrString(va, "free");
    if (!free) { /* MirrorPlacement: next */
        PyErr_Clear();
        E->va = 1;
        rc = import_scalar(E, va, "next", &E->va_next);
        goto out;
    }
    E->va = 0;
    if (!PyList_CheckExact(free) || import_scalar(E, va, "low", &E->va_low) < 0) {
        if (!PyErr_Occurred()) E->declined = "a placement of another shape";
        Py_DECREF(free);
        goto out;
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(free); j++) {
        PyObject *t = PyList_GET_ITEM(free, j);
        int64_t a, s;
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2 || small_int(E, PyTuple_GET_ITEM(t, 0), &a) < 0 ||
            small_int(E, PyTuple_GET_ITEM(t, 1), &s) < 0) {
            if (!PyErr_Occurred() && !E->declined) E->declined = "a placement of another shape";
            Py_DECREF(free);
            goto out;
        }
        if (va_insert(E, E->va_n, a, s) < 0) { /* out of memory: no exception set (the helpers run GIL-free) */
            Py_DECREF(free);
            goto out;
        }
    }
    Py_DECREF(free);
    rc = 0;
out:
    Py_DECREF(va);
    return rc;
}

static int import_i128(PyObject *model, const char *name, i128 *out) {
    PyObject *o = PyObject_GetAttrString(model, name);
    if (!o) return -1;
    int rc = get_i128(o, out);
    Py_DECREF(o);
    return rc;
}

static int import_model(Engine *E, PyObject *model) {
    Interner I = {0};
    int rc = -1;
    E->fl = PyMem_RawCalloc(E->nl ? E->nl : 1, sizeof(FList));
    E->ul = PyMem_RawCalloc(E->nl ? E->nl : 1, sizeof(UList));
    if (!E->fl || !E->ul) {
        PyErr_NoMemory();
        goto out;
    }
    /* gc_on while importing would stamp ages: the recorded ones are read after */
    int gc_on = E->gc_on;
    E->gc_on = 0;
    int ok = import_lists(E, &I, model) == 0;
    E->gc_on = gc_on;
    if (!ok) goto out;
    if (import_dict(E, &I, model, "heads", &E->heads, 1) < 0 || import_dict(E, &I, model, "pend", &E->pend, 1) < 0 ||
        import_dict(E, &I, model, "pmap", &E->pmap, 0) < 0 || import_dict(E, &I, model, "amap", &E->amap, 0) < 0 ||
        import_dict(E, &I, model, "gcb", &E->gcb, 2) < 0 || link_all(E, &I) < 0)
        goto out;
    if (import_vec(E, model, "seg_act", &E->seg_act) < 0 || import_vec(E, model, "seg_size", &E->seg_size) < 0 ||
        import_vec(E, model, "seg_idx", &E->seg_idx) < 0 || import_vec(E, model, "flushes", &E->flushes) < 0)
        goto out;
    if (E->seg_act.n != E->seg_size.n || E->seg_act.n != E->seg_idx.n) {
        E->declined = "segment records of different lengths";
        goto out;
    }
    if (import_i128(model, "reserved", &E->reserved) < 0 || import_i128(model, "peak", &E->peak) < 0 ||
        import_scalar(E, model, "gcc", &E->gcc) < 0 || import_scalar(E, model, "next_resv", &E->next_resv) < 0 ||
        import_scalar(E, model, "cur", &E->cur) < 0 || import_va(E, model) < 0)
        goto out;
    PyObject *ls = PyObject_GetAttrString(model, "lockstep");
    if (!ls) goto out;
    E->lockstep = PyObject_IsTrue(ls);
    Py_DECREF(ls);
    if (E->lockstep < 0) goto out;
    if (E->next_resv < 0 || E->next_resv >= VMAX) {
        E->declined = "a reservation address out of range";
        goto out;
    }
    rc = 0;
out:
    PyMem_RawFree(I.ptr.e);
    PyMem_RawFree(I.objs);
    return rc;
}

/* ------------------------------------------------------------------ export (C -> the Python model) */

static PyObject *from_u128(u128 v) {
    if (v <= (u128)UINT64_MAX) return PyLong_FromUnsignedLongLong((unsigned long long)v);
    unsigned char buf[16];
    for (int j = 0; j < 16; j++) buf[j] = (unsigned char)(v >> (8 * j));
    return _PyLong_FromByteArray(buf, sizeof buf, 1, 0);
}

static PyObject *from_i128(i128 v) {
    if (v >= INT64_MIN && v <= INT64_MAX) return PyLong_FromLongLong((long long)v);
    unsigned char buf[16];
    for (int j = 0; j < 16; j++) buf[j] = (unsigned char)((u128)v >> (8 * j));
    return _PyLong_FromByteArray(buf, sizeof buf, 1, 1);
}

static PyObject *vec_list(const Vec *v) {
    PyObject *l = PyList_New((Py_ssize_t)v->n);
    if (!l) return NULL;
    for (size_t j = 0; j < v->n; j++) {
        PyObject *x = PyLong_FromLongLong(v->v[j]);
        if (!x) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)j, x);
    }
    return l;
}

/* The Python block objects, one per live arena slot (NULL for the dead ones), linked. */
static PyObject **export_blocks(Engine *E) {
    PyObject **objs = PyMem_RawCalloc(E->nb ? (size_t)E->nb : 1, sizeof(PyObject *));
    if (!objs) {
        PyErr_NoMemory();
        return NULL;
    }
    for (int32_t k = 0; k < E->nb; k++) {
        Blk *b = &E->b[k];
        if (b->state == ST_DEAD) continue;
        PyObject *l = PyList_New(5), *s = PyLong_FromLongLong(b->size), *a = PyLong_FromLongLong(b->addr);
        if (!l || !s || !a) {
            Py_XDECREF(l);
            Py_XDECREF(s);
            Py_XDECREF(a);
            goto fail;
        }
        PyObject *st = b->state == ST_FREE ? Py_True : b->state == ST_ALLOC ? Py_False : Py_None;
        Py_INCREF(st);
        Py_INCREF(Py_None);
        Py_INCREF(Py_None);
        PyList_SET_ITEM(l, 0, s);
        PyList_SET_ITEM(l, 1, a);
        PyList_SET_ITEM(l, 2, Py_None);
        PyList_SET_ITEM(l, 3, Py_None);
        PyList_SET_ITEM(l, 4, st);
        objs[k] = l;
    }
    for (int32_t k = 0; k < E->nb; k++) {
        if (!objs[k]) continue;
        int32_t nb[2] = {E->b[k].prev, E->b[k].next};
        for (int w = 0; w < 2; w++) {
            if (nb[w] < 0) continue;
            if (nb[w] >= E->nb || !objs[nb[w]]) {
                PyErr_SetString(PyExc_SystemError, "policy_engine: a live block links a dead one");
                goto fail;
            }
            Py_INCREF(objs[nb[w]]);
            if (PyList_SetItem(objs[k], 2 + w, objs[nb[w]]) < 0) goto fail;
        }
    }
    return objs;
fail:
    for (int32_t k = 0; k < E->nb; k++) Py_XDECREF(objs[k]);
    PyMem_RawFree(objs);
    return NULL;
}

static PyObject *blk_ref(Engine *E, PyObject **objs, int64_t k) {
    if (k < 0 || k >= E->nb || !objs[k]) {
        PyErr_SetString(PyExc_SystemError, "policy_engine: a map holds a dead block");
        return NULL;
    }
    Py_INCREF(objs[k]);
    return objs[k];
}

static PyObject *export_dict(Engine *E, PyObject **objs, const HMap *m, int which) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    HEnt **order = hm_ordered(m);
    if (!order) goto fail;
    for (size_t j = 0; j < m->n; j++) {
        PyObject *k = PyLong_FromLongLong(order[j]->key), *v = NULL;
        if (!k) goto fail_order;
        if (which == 2) {
            v = PyLong_FromLongLong(order[j]->val);
        } else {
            PyObject *b = blk_ref(E, objs, order[j]->val);
            if (b && which == 1) {
                PyObject *lk = PyLong_FromLong(order[j]->aux);
                v = lk ? PyTuple_Pack(2, b, lk) : NULL;
                Py_XDECREF(lk);
                Py_DECREF(b);
            } else {
                v = b;
            }
        }
        int rc = v ? PyDict_SetItem(d, k, v) : -1;
        Py_DECREF(k);
        Py_XDECREF(v);
        if (rc < 0) goto fail_order;
    }
    PyMem_RawFree(order);
    return d;
fail_order:
    PyMem_RawFree(order);
fail:
    Py_DECREF(d);
    return NULL;
}

/* keys/blks (which 0) or ukeys/ublks (which 1): two lists of per-free-list lists. */
static int export_lists(Engine *E, PyObject **objs, int which, PyObject **keys_out, PyObject **blks_out) {
    PyObject *keys = PyList_New(E->nl), *blks = PyList_New(E->nl);
    if (!keys || !blks) goto fail;
    for (int lk = 0; lk < E->nl; lk++) {
        Py_ssize_t n = which ? E->ul[lk].n : E->fl[lk].n;
        PyObject *kl = PyList_New(n), *bl = PyList_New(n);
        Pos p = {0, 0};
        if (!kl || !bl) {
            Py_XDECREF(kl);
            Py_XDECREF(bl);
            goto fail;
        }
        PyList_SET_ITEM(keys, lk, kl);
        PyList_SET_ITEM(blks, lk, bl);
        for (Py_ssize_t j = 0; j < n; j++) {
            PyObject *key = which ? PyLong_FromLongLong(E->ul[lk].addr[j]) : from_u128(full_key(E, &E->fl[lk], pos_key(&E->fl[lk], p, E->w), E->w));
            if (!key) goto fail;
            PyList_SET_ITEM(kl, j, key);
            PyObject *b = blk_ref(E, objs, which ? E->ul[lk].blk[j] : pos_blk(&E->fl[lk], p));
            if (!which) pos_next(&E->fl[lk], &p);
            if (!b) goto fail;
            PyList_SET_ITEM(bl, j, b);
        }
    }
    *keys_out = keys;
    *blks_out = blks;
    return 0;
fail:
    Py_XDECREF(keys);
    Py_XDECREF(blks);
    return -1;
}

static PyObject *export_va(Engine *E) {
    if (E->va < 0) Py_RETURN_NONE;
    if (E->va == 1) return Py_BuildValue("(sL)", "mirror", (long long)E->va_next);
    PyObject *free = PyList_New((Py_ssize_t)E->va_n);
    if (!free) return NULL;
    for (size_t j = 0; j < E->va_n; j++) {
        PyObject *t = Py_BuildValue("(LL)", (long long)E->va_free[j].addr, (long long)E->va_free[j].size);
        if (!t) {
            Py_DECREF(free);
            return NULL;
        }
        PyList_SET_ITEM(free, (Py_ssize_t)j, t);
    }
    return Py_BuildValue("(sLN)", "driver", (long long)E->va_low, free);
}

static int put(PyObject *d, const char *name, PyObject *v) {
    if (!v) return -1;
    int rc = PyDict_SetItemString(d, name, v);
    Py_DECREF(v);
    return rc;
}

/* The final state as {attribute: value} for the Python model (cachemodel._Model.adopt sets them). */
static PyObject *export_model(Engine *E) {
    PyObject **objs = export_blocks(E);
    if (!objs) return NULL;
    PyObject *d = PyDict_New(), *keys = NULL, *blks = NULL, *ukeys = NULL, *ublks = NULL;
    if (!d) goto fail;
    if (export_lists(E, objs, 0, &keys, &blks) < 0) goto fail;
    int r1 = put(d, "keys", keys), r2 = put(d, "blks", blks);
    if (r1 < 0 || r2 < 0) goto fail;
    if (export_lists(E, objs, 1, &ukeys, &ublks) < 0) goto fail;
    r1 = put(d, "ukeys", ukeys);
    r2 = put(d, "ublks", ublks);
    if (r1 < 0 || r2 < 0) goto fail;
    if (put(d, "heads", export_dict(E, objs, &E->heads, 1)) < 0 || put(d, "pend", export_dict(E, objs, &E->pend, 1)) < 0 ||
        put(d, "pmap", export_dict(E, objs, &E->pmap, 0)) < 0 || put(d, "amap", export_dict(E, objs, &E->amap, 0)) < 0 ||
        put(d, "gcb", export_dict(E, objs, &E->gcb, 2)) < 0)
        goto fail;
    if (put(d, "seg_act", vec_list(&E->seg_act)) < 0 || put(d, "seg_size", vec_list(&E->seg_size)) < 0 ||
        put(d, "seg_idx", vec_list(&E->seg_idx)) < 0 || put(d, "flushes", vec_list(&E->flushes)) < 0)
        goto fail;
    if (put(d, "reserved", from_i128(E->reserved)) < 0 || put(d, "peak", from_i128(E->peak)) < 0 ||
        put(d, "gcc", PyLong_FromLongLong(E->gcc)) < 0 || put(d, "next_resv", PyLong_FromLongLong(E->next_resv)) < 0 ||
        put(d, "cur", PyLong_FromLongLong(E->cur)) < 0 || put(d, "lockstep", PyBool_FromLong(E->lockstep)) < 0 ||
        put(d, "va", export_va(E)) < 0)
        goto fail;
    for (int32_t k = 0; k < E->nb; k++) Py_XDECREF(objs[k]);
    PyMem_RawFree(objs);
    return d;
fail:
    for (int32_t k = 0; k < E->nb; k++) Py_XDECREF(objs[k]);
    PyMem_RawFree(objs);
    Py_XDECREF(d);
    return NULL;
}

static PyObject *export_counts(const Engine *E) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int j = 0; j < C_N; j++)
        if (put(d, count_names[j], PyLong_FromLongLong(E->counts[j])) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    /* the width its free-list keys had: 64, or 128 where a 64-bit key did not fit */
    if (put(d, "key_bits", PyLong_FromLong(E->w ? 64 : 128)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* ------------------------------------------------------------------ entry point */

static void engine_free(Engine *E) {
    PyMem_RawFree(E->over);
    PyMem_RawFree(E->below);
    PyMem_RawFree(E->b);
    PyMem_RawFree(E->freeslots.v);
    if (E->fl)
        for (int lk = 0; lk < E->nl; lk++) {
            fl_clear(&E->fl[lk], E->w);
            PyMem_RawFree(E->fl[lk].spare);
            PyMem_RawFree(E->fl[lk].c);
            PyMem_RawFree(E->fl[lk].last);
        }
    if (E->ul)
        for (int lk = 0; lk < E->nl; lk++) {
            PyMem_RawFree(E->ul[lk].addr);
            PyMem_RawFree(E->ul[lk].blk);
        }
    PyMem_RawFree(E->fl);
    PyMem_RawFree(E->ul);
    HMap *maps[] = {&E->amap, &E->pmap, &E->pend, &E->heads, &E->gcb, &E->asz};
    for (int j = 0; j < 6; j++) PyMem_RawFree(maps[j]->e);
    Vec *vecs[] = {&E->seg_act, &E->seg_size, &E->seg_idx, &E->flushes};
    for (int j = 0; j < 4; j++) PyMem_RawFree(vecs[j]->v);
    PyMem_RawFree(E->va_free);
    PyMem_RawFree(E->slot_blk);
    PyMem_RawFree(E->slot_req);
}

/* One engine call with keys of width w (Engine.w); *misfit set, and NULL returned with no exception,
 * where a 64-bit key did not fit: nothing was exported (the model is only read). */
static PyObject *policy_engine_w(PyObject *model, PyObject *pdict, int w, int *misfit) {
    Engine E;
    memset(&E, 0, sizeof E);
    E.w = w;
    E.va = -1;
    Py_buffer views[V_N];
    memset(views, 0, sizeof views);
    Inputs in = {0};
    PyObject *result = NULL, *failed = NULL;
    Vec failed_at = {0}, new_sizes = {0};
    Scan scan = {0};
    int served;
    if (parse_params(&E, pdict, views, &in) < 0 || scan_of(&E, pdict, &in, &scan) < 0) goto done;
    if (check_inputs(&E, &in, &scan, &new_sizes) < 0 || import_model(&E, model) < 0 || size_table(&E, &new_sizes) < 0)
        goto declined;
    if (scan.sid && !E.amap.n) { /* amap by the requests' pairing (amap_pop) */
        E.sid = scan.sid;
        E.nslots = scan.nslots;
        E.slot_blk = PyMem_RawMalloc(((size_t)E.nslots + 1) * sizeof(int32_t));
        E.slot_req = PyMem_RawMalloc(((size_t)E.nslots + 1) * sizeof(Py_ssize_t));
        if (!E.slot_blk || !E.slot_req) goto done;
        for (int32_t s = 0; s < E.nslots; s++) E.slot_blk[s] = -1;
    }
    Py_BEGIN_ALLOW_THREADS /* the policy replays of one report run in threads side by side (report.py) */
    served = BY_WIDTH(serve, E.w, &E, &in, &failed_at);
    if (served == 0 && E.sid) served = slots_to_amap(&E, &in);
    Py_END_ALLOW_THREADS
    if (served < 0) goto declined;
    if (!(failed = vec_list(&failed_at))) goto done;
    PyObject *state = export_model(&E);
    if (!state) goto done;
    PyObject *counts = export_counts(&E);
    if (!counts) {
        Py_DECREF(state);
        goto done;
    }
    result = PyTuple_Pack(3, failed, state, counts);
    Py_DECREF(state);
    Py_DECREF(counts);
    goto done;
declined:
    if (E.misfit && !PyErr_Occurred()) {
        *misfit = 1;
        goto done;
    }
    if (!PyErr_Occurred() && E.declined) result = Py_BuildValue("(Os)", Py_None, E.declined);
done:
    /* The engine's own helpers return -1 without an exception when an allocation fails (they run
     * without the GIL): that is the one failure with nothing set. */
    if (!result && !PyErr_Occurred() && !*misfit) PyErr_NoMemory();
    Py_XDECREF(failed);
    PyMem_RawFree(failed_at.v);
    PyMem_RawFree(new_sizes.v);
    PyMem_RawFree(scan.sizes.v);
    if (scan.own_sid) PyMem_RawFree(scan.sid);
    for (int v = 0; v < V_N; v++)
        if (views[v].obj) PyBuffer_Release(&views[v]);
    engine_free(&E);
    return result;
}

/* policy_engine(model, params) -> (failed, state, counts), or (None, reason) when declined: with 64-bit
 * free-list keys (params' key_bits 64), or from the start again with 128-bit ones where one did not fit
 * (key_bits 128: those from the start). */
PyObject *oomscope_policy_engine(PyObject *self, PyObject *args) {
    PyObject *model, *pdict;
    if (!PyArg_ParseTuple(args, "OO!", &model, &PyDict_Type, &pdict)) return NULL;
    long bits;
    if (p_long(pdict, "key_bits", &bits) < 0) return NULL;
    if (bits != 64 && bits != 128) {
        PyErr_SetString(PyExc_ValueError, "policy_engine: key_bits is 64 or 128");
        return NULL;
    }
    int misfit = 0;
    PyObject *result = policy_engine_w(model, pdict, bits == 64, &misfit);
    if (misfit) {
        misfit = 0; /* a failure of the 128-bit run is its own */
        result = policy_engine_w(model, pdict, 0, &misfit);
    }
    return result;
}
