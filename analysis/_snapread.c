/* The compiled snapshot reader: pickle opcodes straight into trace columns.
 *
 * parse(data, gzip, max_decompressed, max_ratio, grace, nodes_per_byte, min_nodes)
 *   -> None | (raw_len, root, frame_values, classes)
 *
 * It walks the opcodes of a `_dump_snapshot` pickle (optionally gunzipping it
 * first, with libdeflate or zlib) and never builds the Python object graph of the
 * trace: event dicts become rows of event columns (Events), which are the trace's
 * columns themselves (finished in place by export_trace and handed to numpy by a
 * Column), a trace list its first event and a count (C_EVLIST), frame dicts
 * (filename, line, name) records, and frames lists interned sequences of frame
 * records (span_seq: found by their bytes while the memo is not rewritten). An
 * event dict as torch writes it is read by a walk of its own (event_fast), its
 * pairs straight into its record, and it and its frames list get no container
 * (V_EVENT, V_SEQ); anything else it hands back to the general opcode loop (run).
 * parse(...)'s trace tuples are read by fastread._ColumnsConverter; remap(column,
 * table) turns its content classes into stack ids in place. Only the small
 * rest of the file (the root dict, segments, blocks, annotations, settings) is
 * handed back as Python objects, for the reference converter in
 * analysis/convert.py to check and convert with its own code.
 *
 * The rule that makes it safe: this reader *never refuses*. It accepts only
 * input it understands completely and whose result it can prove equal to the
 * Python reader's; on anything else (a cap reached, an unknown or malformed
 * opcode, a value of the wrong type, a mutated or shared container in an odd
 * place, an int beyond int64, nesting deeper than real snapshots go) it returns
 * None, and analysis/fastread.py hands the input to the Python reader, which
 * gives the refusal with its code and message. So every refusal is the
 * reference's own; this file only has to never accept what the reference
 * refuses, and to produce the same columns and stack table when it accepts.
 *
 * Where values are checked (what a new Python refusal must be mirrored in):
 *   - new_long / new_str and the inline   every scalar as it is read (int64 range,
 *     opcodes of run():                   UTF-8 validity);
 *   - make_tuple():                       flat tuples only;
 *   - consume() / dict_set():             nesting depth (MAX_DEPTH), sealing, str keys;
 *   - frame_valid():                      frame dicts (filename str, line int, name str);
 *   - event_set():                        event keys as they are stored (stream >= 0,
 *                                         frames an interned or empty list), from
 *                                         event_pairs(), event_fast() and its
 *                                         ev_pairs_fast() (ev_pair()) alike;
 *   - evlist_extend():                    trace lists: consecutive events only;
 *   - export_trace():                     per-event rules (action, addr, size,
 *                                         stream, time_us, frames, texts, pool_id)
 *                                         and the expansion budget.
 * The rest of the file is checked by convert.Converter itself (fastread.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define SPAN_RECENT 4096
/* The bytes of the first spans met, copied together (see span_seq): 64 KiB holds ~380 frames lists of the
 * usual ~170 bytes; the 460 MB trace has 121. */
#define SPAN_POOL (64 * 1024)
/* Real snapshots nest 9 deep at most (root/segments/seg/blocks/block/history/h/frames/frame). */
#define MAX_DEPTH 12
/* Lists of up to PICKLER_BATCH - 1 items arrive in one APPENDS from a pickler; longer ones are
 * interned when they are sealed instead. More items for an interned list: a hand-made file. */
#define PICKLER_BATCH 1000

/* V_UINT: an int in [2**63, 2**64) (x holds its bits). Torch writes 2**64 - 1 as the line of frames
 * without one; the Python reader takes any int there, and nowhere else an int past int64.
 * V_EVENT: an event dict read by event_fast without a container (x: its record): it is never changed
 * again (SETITEM(S) and APPEND(S) take containers only), only put into a trace list (evlist_extend).
 * V_SEQ: an event's frames list read by event_fast without a container (x: its interned sequence), as
 * unchangeable; only an event's frames (anywhere else it is given up on when exported). */
enum { V_EMPTY = 0, V_NONE, V_TRUE, V_FALSE, V_INT, V_FLOAT, V_STR, V_CONT, V_UINT, V_EVENT, V_SEQ };
/* a value that is a container, or stands for one */
#define IS_REF(kind) ((kind) == V_CONT || (kind) == V_EVENT || (kind) == V_SEQ)
enum { C_LIST = 1, C_SEQ, C_DICT, C_TUPLE, C_FRAME, C_EVENT, C_EVLIST };

/* Known strings: dict keys and values the schema looks at. */
enum {
    K_NONE = 0,
    K_ACTION, K_ADDR, K_SIZE, K_STREAM, K_TIME, K_FRAMES, K_CC, K_UM, K_POOL, K_DFREE,
    K_FILENAME, K_LINE, K_NAME, K_DEVICE_TRACES,
    K_ACT0 = 20, /* 20..28: the nine actions in model order */
    K_NA = 30, K_EMPTYSTR = 31
};
#define ACT_OOM 8

typedef struct {
    uint8_t kind;
    uint8_t key; /* K_* for strings */
    uint16_t pad;
    uint32_t len; /* string length */
    int64_t x;    /* int value, float bits, string offset, container index */
} Val;

/* (ev_pairs_fast writes a Val as two words: kind, key, pad and len in the first) */
_Static_assert(sizeof(Val) == 16 && offsetof(Val, key) == 1 && offsetof(Val, pad) == 2 && offsetof(Val, len) == 4 &&
                   offsetof(Val, x) == 8,
               "Val's layout");

/* 12 bytes: a file has millions (one per event dict and per frames list). */
typedef struct {
    uint8_t kind;
    uint8_t sealed;
    uint8_t depth;
    uint8_t pad;
    uint32_t n;
    /* C_SEQ: seq id; C_FRAME: frame record; C_EVENT: event record; C_EVLIST: its first event record (its
     * items are the n records from there: a trace list); C_LIST/C_TUPLE/C_DICT: the slot of its
     * items (C_LIST/C_TUPLE: n values; C_DICT: n pairs, 2n values), -1 while it has none */
    int32_t ref;
} Cont;

/* The items of a container that holds values (few do: most are events, frames and frames lists). */
typedef struct {
    Val *items;
    size_t cap;
} Slot;
#define ITEMS(p, c) ((c)->ref >= 0 ? (p)->slots[(c)->ref].items : NULL)

typedef struct {
    Val filename, line, name;
    int32_t fvid; /* frame value id once validated, -1 before */
    uint8_t have, extra;
    uint8_t order[3]; /* the keys in the order the file wrote them (torch: name, filename, line) */
} FrameRec;

/* presence bits of an event record */
#define H_ACTION 1
#define H_ADDR 2
#define H_SIZE 4
#define H_STREAM 8
#define H_TIME 16
#define H_FRAMES 32
#define H_CC 64
#define H_UM 128
#define H_POOL 256
#define H_DFREE 512
enum { XC_ACTION, XC_ADDR, XC_SIZE, XC_TIME, XC_CLS, XC_POOL, XC_STREAM, XC_N };

/* flags of an event record: all the trace's export reads of its presence bits (its `have` and `bad` bits
 * live only while its dict is read: ev_flags sums them up) */
#define F_CC_DEFAULT 1
#define F_UM_DEFAULT 2
#define F_TIME_NONE 4 /* no time: absent, or None (which counts as absent, as in the Python reader) */
#define F_POOL 8 /* pool[e] holds its pool pair (the column is written only then: most events have none) */
#define F_FIT 16  /* every key the trace needs is present and of its shape (device_free for an OOM, else addr) */
#define F_DEPTH_SHIFT 5 /* bits 5-6: the nesting depth (1-3) of an event read without a container (V_EVENT) */
/* What an event record needs rarely: device_free (OOM events) and texts that are not the defaults. */
typedef struct {
    int64_t dfree;
    int64_t cc_off, um_off;
    uint32_t cc_len, um_len;
} EvSide;

typedef struct {
    uint64_t *keys;
    int32_t *vals;
    size_t cap, n;
} Map; /* open addressing, key 0 reserved: keys are stored +1 */

/* Event records, a column per field (the trace's columns themselves: a trace whose records are
 * consecutive is exported in place, without a copy). A value is only read where the record's flags
 * say it is there and of its shape (F_FIT). */
typedef struct {
    int8_t *action;
    int64_t *addr, *size, *time;
    int32_t *stream; /* the stream's id among all the file's streams (stream_raw) */
    int32_t *frames; /* interned frames list (sequence id), -1 absent or empty */
    int32_t *pool;   /* pool pair id where F_POOL */
    uint8_t *flags;
    size_t n, cap;
    /* streams (cudaStream_t values) by first appearance in the file: raw value <-> id */
    Map stream_map;
    int64_t *stream_raw;
    size_t stream_n, stream_cap;
    int64_t last_raw; /* the last one looked up, and its id (-1: none yet) */
    int32_t last_sid;
    size_t exported; /* records below this were handed over (changed in place): never exported again */
    Map side_map;    /* record -> index in side */
    EvSide *side;
    size_t side_n, side_cap;
} Events;

typedef struct {
    const unsigned char *buf;
    size_t size, pos;
    Val *stack;
    size_t sn, scap;
    size_t *marks;
    size_t mn, mcap;
    uint32_t *memo; /* MEMO_* encoded values (see memo_enc) */
    size_t memo_cap, memo_len;
    int memo_rewritten; /* a memo entry was overwritten (never by a pickler): the span cache is off */
    /* frames lists by their bytes (the GETs of the same memo entries): span_map hash -> index */
    Map span_map;
    int32_t span_recent[SPAN_RECENT]; /* by a cheap key of a span's bytes: a span index + 1 to try first */
    const unsigned char **span_at; /* a span's bytes: in span_pool, or (the pool full) in the file */
    unsigned char *span_pool;
    size_t span_pool_n;
    uint32_t *span_len;
    uint32_t *span_items; /* its GETs */
    int32_t span_guess[SPAN_RECENT]; /* by some of a span's bytes and span_last: a span index + 1 to try first */
    int32_t span_last; /* the sequence of the span read last */
    int32_t *span_seq;
    size_t span_n, span_cap;
    Val *over; /* memoized values that are neither containers nor known strings */
    size_t over_n, over_cap;
    Val key_val[256]; /* per known string (K_*): the first one met (kind V_EMPTY: none yet) */
    Cont *conts;
    size_t cn, ccap;
    FrameRec *frames;
    size_t fn, fcap;
    Events ev;
    /* The event columns exported in place (XC_*): action, addr, size, time, frames (as content classes), pool
     * and stream (as ordinals). Each is handed over to a Column the first time a trace needs it (its bit set in
     * `handed`); from then on the Column frees it. */
    PyObject *xcol[XC_N];
    unsigned handed;
    /* frame-record sequences (frames lists) */
    int32_t *seqpool;
    size_t sp_n, sp_cap;
    int64_t *seq_off; /* start in seqpool */
    int32_t *seq_len, *seq_cls;
    size_t seq_n, seq_cap;
    Map seq_map; /* hash -> chain head is not kept: we probe on hash and compare */
    /* content classes (sequences of frame value ids) */
    int32_t *clspool;
    size_t cp_n, cp_cap;
    int64_t *cls_off;
    int32_t *cls_len;
    size_t cls_n, cls_cap;
    Map cls_map;
    /* frame values (filename, line, name) */
    int32_t *fv_rec; /* a frame record holding the value */
    size_t fv_n, fv_cap;
    Map fv_map;
    /* pool pairs */
    int64_t *pool_a, *pool_b;
    size_t pool_n, pool_cap;
    Map pool_map;
    /* The Python object exported per container, found by its index through cache_map: few containers are
     * exported (the root, segments, blocks, annotations), where an array of one pointer per container was
     * 8 bytes per event and frames list, zeroed and read back whole when released (~8k page faults on the
     * 460 MB benchmark). */
    Map cache_map;
    PyObject **cache;
    size_t cache_n, cache_cap;
    PyObject **fcache; /* exported Python dict per frame record */
    Slot *slots; /* the items of containers (see Cont.ref) */
    size_t sl_n, sl_cap;
    int64_t budget, charged;
    struct Prefault *pf; /* the pages ahead made present on another thread (NULL: none) */
    unsigned pf_tick;
} P;

/* Where the last parse of this thread gave up: a source line, so tests and debugging can say why a file
 * took the reference path. Per thread: the parse runs without the GIL. */
static _Thread_local int give_up_line;
#define GIVE_UP(rc) (give_up_line = __LINE__, (rc))

/* ------------------------------------------------------------------------- */
/* small helpers                                                               */

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return GIVE_UP(-1);
    *p = q;
    *cap = c;
    return 0;
}

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* Four independent lanes: the multiply chain of one lane would bound the speed (a hash per frames list). */
static uint64_t hash_i32(const int32_t *a, size_t n) {
    uint64_t h0 = 0x9e3779b97f4a7c15ULL ^ n, h1 = 0xbf58476d1ce4e5b9ULL, h2 = 0x94d049bb133111ebULL, h3 = 0x2545f4914f6cdd1dULL;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        h0 = (h0 ^ (uint32_t)a[i]) * 0x100000001b3ULL;
        h1 = (h1 ^ (uint32_t)a[i + 1]) * 0x100000001b3ULL;
        h2 = (h2 ^ (uint32_t)a[i + 2]) * 0x100000001b3ULL;
        h3 = (h3 ^ (uint32_t)a[i + 3]) * 0x100000001b3ULL;
    }
    for (; i < n; i++) h0 = (h0 ^ (uint32_t)a[i]) * 0x100000001b3ULL;
    return mix(h0 ^ mix(h1) ^ (mix(h2) << 1) ^ (mix(h3) << 2));
}

static int map_init(Map *m, size_t cap) {
    size_t c = 64;
    while (c < cap * 2) c *= 2;
    m->keys = calloc(c, sizeof(uint64_t));
    m->vals = malloc(c * sizeof(int32_t));
    m->cap = c;
    m->n = 0;
    return (m->keys && m->vals) ? 0 : -1;
}
static void map_free(Map *m) {
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
}
static int map_grow(Map *m) {
    Map nm;
    if (map_init(&nm, m->cap) < 0) return GIVE_UP(-1);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = mix(m->keys[i]) & (nm.cap - 1);
        while (nm.keys[j]) j = (j + 1) & (nm.cap - 1);
        nm.keys[j] = m->keys[i];
        nm.vals[j] = m->vals[i];
    }
    nm.n = m->n;
    map_free(m);
    *m = nm;
    return 0;
}
/* Slot of key k (found or empty): plain integer keys, no collision compare needed. */
static inline size_t map_slot(Map *m, uint64_t k) {
    uint64_t kk = k + 1;
    size_t j = mix(kk) & (m->cap - 1);
    while (m->keys[j] && m->keys[j] != kk) j = (j + 1) & (m->cap - 1);
    return j;
}
static inline int map_get(Map *m, uint64_t k, int32_t *out) {
    size_t j = map_slot(m, k);
    if (!m->keys[j]) return 0;
    *out = m->vals[j];
    return 1;
}
static int map_put(Map *m, uint64_t k, int32_t v) {
    if ((m->n + 1) * 2 > m->cap && map_grow(m) < 0) return GIVE_UP(-1);
    size_t j = map_slot(m, k);
    if (!m->keys[j]) m->n++;
    m->keys[j] = k + 1;
    m->vals[j] = v;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* scalars                                                                     */

/* UTF-8 as CPython decodes it with errors="surrogatepass" (what the unpickler does). */
static int utf8_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            unsigned char c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0; /* overlong */
            i += 3;                                /* ED A0..BF: surrogates pass */
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            unsigned char c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;
            if (c == 0xF4 && c1 > 0x8F) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static uint8_t key_of(const unsigned char *s, size_t n) {
#define IS(lit) (n == sizeof(lit) - 1 && memcmp(s, lit, n) == 0)
    switch (n) {
    case 0:
        return K_EMPTYSTR;
    case 3:
        if (IS("N/A")) return K_NA;
        break;
    case 4:
        if (IS("addr")) return K_ADDR;
        if (IS("size")) return K_SIZE;
        if (IS("line")) return K_LINE;
        if (IS("name")) return K_NAME;
        break;
    case 5:
        if (IS("alloc")) return K_ACT0 + 0;
        break;
    case 6:
        if (IS("action")) return K_ACTION;
        if (IS("stream")) return K_STREAM;
        if (IS("frames")) return K_FRAMES;
        break;
    case 7:
        if (IS("time_us")) return K_TIME;
        if (IS("pool_id")) return K_POOL;
        break;
    case 8:
        if (IS("filename")) return K_FILENAME;
        if (IS("snapshot")) return K_ACT0 + 7;
        break;
    }
    if (IS("oom")) return K_ACT0 + 8;
    if (IS("device_free")) return K_DFREE;
    if (IS("user_metadata")) return K_UM;
    if (IS("compile_context")) return K_CC;
    if (IS("device_traces")) return K_DEVICE_TRACES;
    if (IS("free_requested")) return K_ACT0 + 1;
    if (IS("free_completed")) return K_ACT0 + 2;
    if (IS("segment_alloc")) return K_ACT0 + 3;
    if (IS("segment_free")) return K_ACT0 + 4;
    if (IS("segment_map")) return K_ACT0 + 5;
    if (IS("segment_unmap")) return K_ACT0 + 6;
    return K_NONE;
#undef IS
}

/* ------------------------------------------------------------------------- */
/* the value stack and containers                                            */

static inline __attribute__((always_inline)) int push(P *p, Val v) {
    if (__builtin_expect(p->sn == p->scap, 0) && grow((void **)&p->stack, &p->scap, p->sn + 1, sizeof(Val)) < 0)
        return GIVE_UP(-1);
    p->stack[p->sn++] = v;
    return 0;
}

static size_t fence(P *p) { return p->mn ? p->marks[p->mn - 1] : 0; }

/* A new container: its index, or -1 to give up. */
static inline __attribute__((always_inline)) int64_t cont_new(P *p, uint8_t kind) {
    if (__builtin_expect(p->cn == p->ccap, 0) && grow((void **)&p->conts, &p->ccap, p->cn + 1, sizeof(Cont)) < 0)
        return GIVE_UP(-1);
    if (p->cn >= INT32_MAX) return GIVE_UP(-1);
    Cont *c = &p->conts[p->cn];
    memset(c, 0, sizeof(*c));
    c->kind = kind;
    c->depth = 1;
    c->ref = -1;
    return (int64_t)p->cn++;
}

static int new_cont(P *p, uint8_t kind, Val *out) {
    int64_t ci = cont_new(p, kind);
    if (ci < 0) return -1;
    out->kind = V_CONT;
    out->key = 0;
    out->pad = 0;
    out->len = 0;
    out->x = ci;
    return 0;
}

/* The items of container ci (a list, tuple or dict) grow to hold `need` values (a slot made the first time). */
static int items_grow(P *p, int64_t ci, size_t need) {
    Cont *c = &p->conts[ci];
    if (c->ref < 0) {
        if (p->sl_n >= INT32_MAX || grow((void **)&p->slots, &p->sl_cap, p->sl_n + 1, sizeof(Slot)) < 0)
            return GIVE_UP(-1);
        p->slots[p->sl_n].items = NULL;
        p->slots[p->sl_n].cap = 0;
        c->ref = (int32_t)p->sl_n++;
    }
    Slot *sl = &p->slots[c->ref];
    if (need > UINT32_MAX / 2 || grow((void **)&sl->items, &sl->cap, need, sizeof(Val)) < 0) return GIVE_UP(-1);
    return 0;
}

static int cont_append(P *p, int64_t ci, const Val *v, size_t k) {
    if (items_grow(p, ci, (size_t)p->conts[ci].n + k) < 0) return -1;
    Cont *c = &p->conts[ci];
    memcpy(ITEMS(p, c) + c->n, v, k * sizeof(Val));
    c->n += (uint32_t)k;
    return 0;
}

static int try_seq(P *p, Cont *list, const Val *items, size_t n);

/* A value goes into a container: it is sealed there (a pickler never changes a
 * container after writing it into another, so a later mutation means a hostile
 * or damaged file, and cycles cannot form without one); the parent's depth grows. */
static inline __attribute__((always_inline)) int consume(P *p, Cont *parent, const Val *v) {
    if (v->kind == V_EVENT || v->kind == V_SEQ) { /* (never changed: sealed already) */
        uint8_t depth = v->kind == V_SEQ ? 2 : (p->ev.flags[v->x] >> F_DEPTH_SHIFT) & 3;
        if (depth + 1 > parent->depth) {
            parent->depth = depth + 1;
            if (parent->depth > MAX_DEPTH) return GIVE_UP(-1);
        }
        return 0;
    }
    if (v->kind != V_CONT) return 0;
    Cont *c = &p->conts[v->x];
    if (c == parent) return GIVE_UP(-1); /* into itself: the one cycle an unsealed container allows */
    if (!c->sealed && c->kind == C_LIST && c->n >= PICKLER_BATCH) {
        if (try_seq(p, c, ITEMS(p, c), c->n) < 0) return GIVE_UP(-1);
        c = &p->conts[v->x];
    }
    c->sealed = 1;
    if (c->depth + 1 > parent->depth) {
        parent->depth = c->depth + 1;
        if (parent->depth > MAX_DEPTH) return GIVE_UP(-1);
    }
    return 0;
}

/* frame value ids: (filename, line, name) by content */
static int frame_valid(P *p, int32_t rec) {
    FrameRec *f = &p->frames[rec];
    if (f->fvid >= 0) return 1;
    if (f->have != 7 || f->extra) return 0;
    if (f->filename.kind != V_STR || f->name.kind != V_STR || (f->line.kind != V_INT && f->line.kind != V_UINT)) return 0;
    uint64_t h = 0x12345;
    h = (h ^ mix((uint64_t)f->line.x + f->line.kind)) * 0x100000001b3ULL;
    for (uint32_t i = 0; i < f->filename.len; i++) h = (h ^ p->buf[f->filename.x + i]) * 0x100000001b3ULL;
    h = (h ^ 0xff) * 0x100000001b3ULL;
    for (uint32_t i = 0; i < f->name.len; i++) h = (h ^ p->buf[f->name.x + i]) * 0x100000001b3ULL;
    h = mix(h) & 0x7fffffffffffffffULL;
    /* probe: the map holds hash -> fvid; collisions continue at hash+1 (compared by content) */
    for (;;) {
        int32_t fv;
        if (!map_get(&p->fv_map, h, &fv)) break;
        FrameRec *g = &p->frames[p->fv_rec[fv]];
        if (g->line.x == f->line.x && g->line.kind == f->line.kind && g->filename.len == f->filename.len && g->name.len == f->name.len &&
            memcmp(p->buf + g->filename.x, p->buf + f->filename.x, f->filename.len) == 0 &&
            memcmp(p->buf + g->name.x, p->buf + f->name.x, f->name.len) == 0) {
            f->fvid = fv;
            return 1;
        }
        h = (h + 1) & 0x7fffffffffffffffULL;
    }
    if (grow((void **)&p->fv_rec, &p->fv_cap, p->fv_n + 1, sizeof(int32_t)) < 0) return GIVE_UP(-1);
    p->fv_rec[p->fv_n] = rec;
    if (map_put(&p->fv_map, h, (int32_t)p->fv_n) < 0) return GIVE_UP(-1);
    f->fvid = (int32_t)p->fv_n++;
    return 1;
}

/* The content class of a sequence of frame records (by frame values). */
static int class_of(P *p, const int32_t *recs, size_t n, int32_t *out) {
    int32_t tmp[64];
    int32_t *fv = n <= 64 ? tmp : malloc(n * sizeof(int32_t));
    if (!fv) return GIVE_UP(-1);
    for (size_t i = 0; i < n; i++) fv[i] = p->frames[recs[i]].fvid;
    uint64_t h = hash_i32(fv, n) & 0x7fffffffffffffffULL;
    int rc = 0;
    for (;;) {
        int32_t c;
        if (!map_get(&p->cls_map, h, &c)) break;
        if ((size_t)p->cls_len[c] == n && memcmp(p->clspool + p->cls_off[c], fv, n * sizeof(int32_t)) == 0) {
            *out = c;
            goto done;
        }
        h = (h + 1) & 0x7fffffffffffffffULL;
    }
    if (grow((void **)&p->clspool, &p->cp_cap, p->cp_n + n, sizeof(int32_t)) < 0 ||
        grow((void **)&p->cls_off, &p->cls_cap, p->cls_n + 1, sizeof(int64_t)) < 0) {
        rc = -1;
        goto done;
    }
    {
        size_t cap2 = p->cls_cap;
        /* cls_len shares cls_cap: grow it to the same size */
        int32_t *q = realloc(p->cls_len, cap2 * sizeof(int32_t));
        if (!q) {
            rc = -1;
            goto done;
        }
        p->cls_len = q;
    }
    memcpy(p->clspool + p->cp_n, fv, n * sizeof(int32_t));
    p->cls_off[p->cls_n] = (int64_t)p->cp_n;
    p->cls_len[p->cls_n] = (int32_t)n;
    p->cp_n += n;
    if (map_put(&p->cls_map, h, (int32_t)p->cls_n) < 0) {
        rc = -1;
        goto done;
    }
    *out = (int32_t)p->cls_n++;
done:
    if (fv != tmp) free(fv);
    return rc;
}

/* A frames list's items -> an interned sequence id: 1 interned, 0 not all valid frame dicts, -1 error.
 * Sequences are keyed by the items' container ids (the frame dicts' identities), so the usual case
 * (a list of frame dicts the file shares through its memo, seen before) is one hash and one compare;
 * only a new sequence has its frames checked (and sealed: a checked frame dict never changes). */
static int seq_intern_ids(P *p, const int32_t *ids, size_t n, int32_t *out);

static int seq_intern(P *p, const Val *items, size_t n, int32_t *out) {
    int32_t tmp[256];
    int32_t *ids = n <= 256 ? tmp : malloc(n * sizeof(int32_t));
    int rc = 0;
    if (!ids) return GIVE_UP(-1);
    for (size_t i = 0; i < n; i++) {
        if (items[i].kind != V_CONT) goto done;
        ids[i] = (int32_t)items[i].x;
    }
    rc = seq_intern_ids(p, ids, n, out);
done:
    if (ids != tmp) free(ids);
    return rc;
}

/* The same, from the items' container ids. */
static int seq_intern_ids(P *p, const int32_t *ids, size_t n, int32_t *out) {
    int32_t tmp[256];
    int32_t *recs = n <= 256 ? tmp : malloc(n * sizeof(int32_t));
    int rc = 0;
    if (!recs) return GIVE_UP(-1);
    if (n == 0 || n > INT32_MAX) goto done;
    uint64_t h = hash_i32(ids, n) & 0x7fffffffffffffffULL;
    for (;;) {
        int32_t s;
        if (!map_get(&p->seq_map, h, &s)) break;
        if ((size_t)p->seq_len[s] == n && memcmp(p->seqpool + p->seq_off[s], ids, n * sizeof(int32_t)) == 0) {
            *out = s;
            rc = 1;
            goto done;
        }
        h = (h + 1) & 0x7fffffffffffffffULL;
    }
    for (size_t i = 0; i < n; i++) {
        Cont *c = &p->conts[ids[i]];
        if (c->kind != C_FRAME) goto done;
        int ok = frame_valid(p, c->ref);
        if (ok <= 0) {
            rc = ok;
            goto done;
        }
        recs[i] = c->ref;
    }
    for (size_t i = 0; i < n; i++) p->conts[ids[i]].sealed = 1;
    rc = -1;
    if (grow((void **)&p->seqpool, &p->sp_cap, p->sp_n + n, sizeof(int32_t)) < 0) goto done;
    size_t cap = p->seq_cap;
    if (grow((void **)&p->seq_off, &cap, p->seq_n + 1, sizeof(int64_t)) < 0) goto done;
    if (cap != p->seq_cap) {
        int32_t *a = realloc(p->seq_len, cap * sizeof(int32_t));
        if (!a) goto done;
        p->seq_len = a;
        int32_t *b = realloc(p->seq_cls, cap * sizeof(int32_t));
        if (!b) goto done;
        p->seq_cls = b;
        p->seq_cap = cap;
    }
    int32_t cls;
    if (class_of(p, recs, n, &cls) < 0) goto done;
    memcpy(p->seqpool + p->sp_n, ids, n * sizeof(int32_t));
    p->seq_off[p->seq_n] = (int64_t)p->sp_n;
    p->seq_len[p->seq_n] = (int32_t)n;
    p->seq_cls[p->seq_n] = cls;
    p->sp_n += n;
    if (map_put(&p->seq_map, h, (int32_t)p->seq_n) < 0) goto done;
    *out = (int32_t)p->seq_n++;
    rc = 1;
done:
    if (recs != tmp) free(recs);
    return rc < 0 ? GIVE_UP(-1) : rc;
}

/* A list whose items are all frame dicts becomes an interned sequence. */
static int try_seq(P *p, Cont *list, const Val *items, size_t n) {
    int32_t s;
    int rc = seq_intern(p, items, n, &s);
    if (rc == 1) {
        if (list->ref >= 0) {
            Slot *sl = &p->slots[list->ref];
            free(sl->items);
            sl->items = NULL;
            sl->cap = 0;
        }
        list->kind = C_SEQ;
        list->ref = s;
        list->n = (uint32_t)n;
        if (list->depth < 2) list->depth = 2;
    }
    return rc < 0 ? -1 : 0;
}




/* ------------------------------------------------------------------------- */
/* dicts: generic pairs, event records, frame records                          */

/* Room for `need` event records in every column (the capacity moves only once all have it). */
static int ev_grow(Events *ev, size_t need) {
    if (need <= ev->cap) return 0;
    size_t c = ev->cap ? ev->cap : 1024;
    while (c < need) c *= 2;
#define EV_COL(F)                                                                                                 \
    do {                                                                                                          \
        void *q_ = realloc(ev->F, c * sizeof(*ev->F));                                                            \
        if (!q_) return GIVE_UP(-1);                                                                              \
        ev->F = q_;                                                                                               \
    } while (0)
    EV_COL(action);
    EV_COL(addr);
    EV_COL(size);
    EV_COL(stream);
    EV_COL(time);
    EV_COL(frames);
    EV_COL(pool);
    EV_COL(flags);
#undef EV_COL
    ev->cap = c;
    return 0;
}

/* The columns not handed over to a Column (bit XC_* of `handed` set: that one frees it). */
static void ev_free(Events *ev, unsigned handed) {
    if (!(handed & 1u << XC_ACTION)) free(ev->action);
    if (!(handed & 1u << XC_ADDR)) free(ev->addr);
    if (!(handed & 1u << XC_SIZE)) free(ev->size);
    if (!(handed & 1u << XC_TIME)) free(ev->time);
    if (!(handed & 1u << XC_CLS)) free(ev->frames);
    if (!(handed & 1u << XC_POOL)) free(ev->pool);
    if (!(handed & 1u << XC_STREAM)) free(ev->stream);
    free(ev->stream_raw);
    map_free(&ev->stream_map);
    free(ev->flags);
    free(ev->side);
    map_free(&ev->side_map);
}

/* A new event record: its index, or -1. Its presence bits and flags are written by its first SETITEMS
 * (event_pairs, which dict_set calls at once: nothing present, the texts at their defaults). */
static int64_t ev_new(Events *ev) {
    if (ev->n >= INT32_MAX || (ev->n == ev->cap && ev_grow(ev, ev->n + 1) < 0)) return GIVE_UP(-1);
    size_t e = ev->n++;
    ev->action[e] = 0;
    ev->frames[e] = -1;
    return (int64_t)e;
}

/* The side record of event e (made on first use); NULL to give up. */
static EvSide *ev_side(Events *ev, size_t e) {
    int32_t i;
    if (map_get(&ev->side_map, e, &i)) return &ev->side[i];
    if (ev->side_n >= INT32_MAX || grow((void **)&ev->side, &ev->side_cap, ev->side_n + 1, sizeof(EvSide)) < 0)
        return GIVE_UP(NULL);
    if (map_put(&ev->side_map, e, (int32_t)ev->side_n) < 0) return GIVE_UP(NULL);
    EvSide *x = &ev->side[ev->side_n++];
    memset(x, 0, sizeof(*x));
    return x;
}

/* The id of stream value raw (>= 0) among the file's streams (a new one gets the next); -1 to give up. */
static int32_t stream_id_new(Events *ev, int64_t raw);
static inline int32_t stream_id(Events *ev, int64_t raw) {
    /* (inline: nearly every event names the stream of the one before) */
    return ev->last_sid >= 0 && raw == ev->last_raw ? ev->last_sid : stream_id_new(ev, raw);
}

static int32_t stream_id_new(Events *ev, int64_t raw) {
    int32_t id;
    if (!map_get(&ev->stream_map, (uint64_t)raw, &id)) {
        if (ev->stream_n >= INT32_MAX ||
            grow((void **)&ev->stream_raw, &ev->stream_cap, ev->stream_n + 1, sizeof(int64_t)) < 0)
            return GIVE_UP(-1);
        id = (int32_t)ev->stream_n;
        if (map_put(&ev->stream_map, (uint64_t)raw, id) < 0) return GIVE_UP(-1);
        ev->stream_raw[ev->stream_n++] = raw;
    }
    ev->last_raw = raw, ev->last_sid = id;
    return id;
}

/* One key of event e. Its presence bits and flags are the caller's locals (written back once per SETITEMS):
 * stores through a uint8_t would make the compiler reload every column pointer after them. */
static inline __attribute__((always_inline)) int event_set(P *p, size_t e, uint8_t key, const Val v,
                                                           uint16_t *have, uint16_t *bad, uint8_t *flags) {
    Events *ev = &p->ev;
    switch (key) {
    case K_ACTION:
        *have |= H_ACTION;
        if (v.kind == V_STR && v.key >= K_ACT0 && v.key < K_ACT0 + 9) {
            ev->action[e] = (int8_t)(v.key - K_ACT0);
            *bad &= ~H_ACTION;
        } else
            *bad |= H_ACTION;
        break;
#define INTSLOT(KEY, BIT, FIELD, NONNEG)                                                                          \
    case KEY:                                                                                                     \
        *have |= BIT;                                                                                       \
        if (v.kind == V_INT && (!(NONNEG) || v.x >= 0)) {                                                       \
            ev->FIELD[e] = v.x;                                                                                  \
            *bad &= ~BIT;                                                                                   \
        } else                                                                                                    \
            *bad |= BIT;                                                                                    \
        break;
        INTSLOT(K_ADDR, H_ADDR, addr, 1)
        INTSLOT(K_SIZE, H_SIZE, size, 1)
#undef INTSLOT
    case K_STREAM:
        *have |= H_STREAM;
        /* a negative stream is the reference's to judge: never exported */
        if (v.kind == V_INT && v.x >= 0) {
            int32_t id = stream_id(ev, v.x);
            if (id < 0) return -1;
            ev->stream[e] = id;
            *bad &= ~H_STREAM;
        } else
            *bad |= H_STREAM;
        break;
    case K_DFREE:
        *have |= H_DFREE;
        if (v.kind == V_INT && v.x >= 0) {
            EvSide *x = ev_side(ev, e);
            if (!x) return -1;
            x->dfree = v.x;
            *bad &= ~H_DFREE;
        } else
            *bad |= H_DFREE;
        break;
    case K_TIME:
        *have |= H_TIME;
        *bad &= ~H_TIME;
        *flags &= ~F_TIME_NONE;
        if (v.kind == V_INT)
            ev->time[e] = v.x;
        else if (v.kind == V_NONE)
            *flags |= F_TIME_NONE; /* None counts as absent, as in the Python reader */
        else
            *bad |= H_TIME;
        break;
    case K_FRAMES:
        /* The value was consumed (sealed) already: what it holds is final. A frames list of frame dicts
         * is an interned sequence by now; an empty list means no frames; anything else is bad. */
        *have |= H_FRAMES;
        *bad &= ~H_FRAMES;
        ev->frames[e] = -1;
        if (v.kind == V_SEQ)
            ev->frames[e] = (int32_t)v.x;
        else if (v.kind == V_CONT && p->conts[v.x].kind == C_SEQ)
            ev->frames[e] = p->conts[v.x].ref;
        else if (!(v.kind == V_CONT && p->conts[v.x].kind == C_LIST && p->conts[v.x].n == 0))
            *bad |= H_FRAMES;
        break;
    case K_CC:
    case K_UM: {
        int cc = key == K_CC;
        uint16_t bit = cc ? H_CC : H_UM;
        uint8_t def = cc ? F_CC_DEFAULT : F_UM_DEFAULT;
        *have |= bit;
        *bad &= ~bit;
        if (v.kind != V_STR) {
            *bad |= bit;
        } else if (v.key == (cc ? K_NA : K_EMPTYSTR)) {
            *flags |= def;
        } else {
            EvSide *x = ev_side(ev, e);
            if (!x) return -1;
            *flags &= ~def;
            if (cc)
                x->cc_off = v.x, x->cc_len = v.len;
            else
                x->um_off = v.x, x->um_len = v.len;
        }
        break;
    }
    case K_POOL:
        *have |= H_POOL;
        *bad &= ~H_POOL;
        *flags &= ~F_POOL;
        if (v.kind == V_NONE) break;
        if (v.kind == V_CONT) {
            Cont *c = &p->conts[v.x];
            const Val *it = (c->kind == C_TUPLE || c->kind == C_LIST) && c->n == 2 ? ITEMS(p, c) : NULL;
            if (it && it[0].kind == V_INT && it[1].kind == V_INT) {
                int64_t a = it[0].x, b = it[1].x;
                uint64_t h = mix((uint64_t)a * 31 + mix((uint64_t)b)) & 0x7fffffffffffffffULL;
                for (;;) {
                    int32_t id;
                    if (!map_get(&p->pool_map, h, &id)) break;
                    if (p->pool_a[id] == a && p->pool_b[id] == b) {
                        ev->pool[e] = id;
                        *flags |= F_POOL;
                        return 0;
                    }
                    h = (h + 1) & 0x7fffffffffffffffULL;
                }
                size_t cap = p->pool_cap;
                if (grow((void **)&p->pool_a, &cap, p->pool_n + 1, sizeof(int64_t)) < 0) return GIVE_UP(-1);
                if (cap != p->pool_cap) {
                    int64_t *q = realloc(p->pool_b, cap * sizeof(int64_t));
                    if (!q) return GIVE_UP(-1);
                    p->pool_b = q;
                    p->pool_cap = cap;
                }
                p->pool_a[p->pool_n] = a;
                p->pool_b[p->pool_n] = b;
                if (map_put(&p->pool_map, h, (int32_t)p->pool_n) < 0) return GIVE_UP(-1);
                ev->pool[e] = (int32_t)p->pool_n++;
                *flags |= F_POOL;
                return 0;
            }
        }
        *bad |= H_POOL;
        break;
    default:
        break; /* unknown keys are never looked at, as in the Python reader */
    }
    return 0;
}

/* The flags of event record e, its dict read: `have` and `bad` (present but not of the shape the trace
 * needs) summed up in F_FIT and F_TIME_NONE. */
static inline uint8_t ev_flags(const Events *ev, size_t e, uint16_t have, uint16_t bad, uint8_t flags) {
    /* (action[e] is the event's action where H_ACTION is in have and not in bad, which `need` asks) */
    uint16_t need = H_ACTION | H_SIZE | H_STREAM | (ev->action[e] == ACT_OOM ? H_DFREE : H_ADDR);
    if ((have & need) == need && !(bad & (need | H_TIME | H_FRAMES | H_CC | H_UM | H_POOL))) flags |= F_FIT;
    if (!(have & H_TIME)) flags |= F_TIME_NONE;
    return flags;
}

/* The SETITEMS into event record c->ref (its values consumed into it as they are set); `fresh`: the dict's first.
 * A second one (to an event dict: never from a pickler, which writes up to 1000 items at a time) is given up on:
 * the record keeps its flags, not the presence bits a later key would change. */
static int event_pairs(P *p, Cont *c, const Val *pairs, size_t n, int fresh) {
    size_t e = (size_t)c->ref;
    if (!fresh) return n ? GIVE_UP(-1) : 0;
    uint16_t have = 0, bad = 0;
    uint8_t flags = F_CC_DEFAULT | F_UM_DEFAULT;
    for (size_t i = 0; i < n; i++) {
        const Val *k = &pairs[2 * i], *v = &pairs[2 * i + 1];
        if (k->kind != V_STR) return GIVE_UP(-1); /* only str keys: anything else is the reference's call */
        if (IS_REF(v->kind) && consume(p, c, v) < 0) return GIVE_UP(-1);
        if (event_set(p, e, k->key, *v, &have, &bad, &flags) < 0) return GIVE_UP(-1);
    }
    p->ev.flags[e] = ev_flags(&p->ev, e, have, bad, flags);
    c->n += (uint32_t)n;
    return 0;
}

static int frame_set(FrameRec *f, const Val *k, const Val *v) {
    switch (k->key) {
    case K_FILENAME:
        f->filename = *v, f->have |= 1;
        break;
    case K_LINE:
        f->line = *v, f->have |= 2;
        break;
    case K_NAME:
        f->name = *v, f->have |= 4;
        break;
    default:
        f->extra = 1;
    }
    f->fvid = -1;
    return 0;
}

/* Set pairs[0..2n) into dict container ci. Returns -1 to give up. */
static int dict_set(P *p, int64_t ci, const Val *pairs, size_t n) {
    Cont *c = &p->conts[ci];
    if (c->sealed) return GIVE_UP(-1);
    int fresh = 0;
    if (c->kind == C_DICT && c->n == 0 && n > 0) {
        /* The first items decide what the dict is: an event (it has "action": torch writes it first), a
         * frame, or anything else. */
        int has_action = pairs[0].key == K_ACTION, frame_keys = n == 3, seen = 0;
        for (size_t i = 0; i < n && !has_action; i++) {
            uint8_t k = pairs[2 * i].key;
            if (k == K_ACTION) has_action = 1;
            if (k != K_FILENAME && k != K_LINE && k != K_NAME) frame_keys = 0;
            else seen |= 1 << (k - K_FILENAME);
        }
        if (seen != 7) frame_keys = 0;
        if (has_action) {
            int64_t e = ev_new(&p->ev);
            if (e < 0) return -1;
            c->kind = C_EVENT;
            c->ref = (int32_t)e;
            fresh = 1;
        } else if (frame_keys) {
            if (grow((void **)&p->frames, &p->fcap, p->fn + 1, sizeof(FrameRec)) < 0) return GIVE_UP(-1);
            FrameRec *f = &p->frames[p->fn];
            memset(f, 0, sizeof(*f));
            f->fvid = -1;
            for (int i = 0; i < 3; i++) f->order[i] = pairs[2 * i].key;
            c->kind = C_FRAME;
            c->ref = (int32_t)p->fn++;
        }
    }
    if (c->kind == C_EVENT) return event_pairs(p, c, pairs, n, fresh);
    for (size_t i = 0; i < n; i++) {
        if (pairs[2 * i].kind != V_STR) return GIVE_UP(-1); /* only str keys: anything else is the reference's call */
        if (IS_REF(pairs[2 * i + 1].kind) && consume(p, c, &pairs[2 * i + 1]) < 0) return GIVE_UP(-1);
    }
    if (c->kind == C_FRAME) {
        FrameRec *f = &p->frames[c->ref];
        if (f->fvid >= 0) return GIVE_UP(-1);
        for (size_t i = 0; i < n; i++) frame_set(f, &pairs[2 * i], &pairs[2 * i + 1]);
        c->n += (uint32_t)n;
        return 0;
    }
    if (c->kind != C_DICT) return GIVE_UP(-1);
    for (size_t i = 0; i < n; i++)
        if (pairs[2 * i].key == K_ACTION) return GIVE_UP(-1); /* an event-like dict built oddly */
    if (items_grow(p, ci, 2 * ((size_t)c->n + n)) < 0) return -1;
    c = &p->conts[ci];
    memcpy(ITEMS(p, c) + 2 * (size_t)c->n, pairs, 2 * n * sizeof(Val));
    c->n += (uint32_t)n;
    return 0;
}

/* Items into a list that starts with an event: a trace list, whose items must be consecutive event records (a
 * pickler writes each event dict as it appends it). It keeps the first record and the count, not the items.
 * Anything else in such a list would be given up on when it is exported (export_trace takes consecutive
 * records only, and an event is exported nowhere else): given up on now. */
static inline int64_t event_of(const P *p, const Val *v) {
    if (v->kind == V_EVENT) return v->x;
    return v->kind == V_CONT && p->conts[v->x].kind == C_EVENT ? p->conts[v->x].ref : -1;
}

static int evlist_extend(P *p, Cont *c, const Val *items, size_t n) {
    /* (a C_LIST here starts with an event: list_extend checked its first item) */
    size_t next = c->kind == C_EVLIST ? (size_t)c->ref + c->n : (size_t)event_of(p, &items[0]), first = next;
    if ((size_t)c->n + n > UINT32_MAX / 2) return GIVE_UP(-1);
    for (size_t i = 0; i < n; i++) {
        const Val *it = &items[i];
        if (event_of(p, it) != (int64_t)(next + i)) return GIVE_UP(-1);
        if (consume(p, c, it) < 0) return GIVE_UP(-1);
    }
    if (c->kind == C_LIST) c->kind = C_EVLIST, c->ref = (int32_t)first; /* (an EVLIST keeps its first) */
    c->n += (uint32_t)n;
    return 0;
}

static int list_extend(P *p, int64_t ci, const Val *items, size_t n) {
    Cont *c = &p->conts[ci];
    if (c->sealed || (c->kind != C_LIST && c->kind != C_EVLIST)) return GIVE_UP(-1); /* a C_SEQ is never added to */
    if (n == 0) return 0;
    if (c->kind == C_EVLIST || (c->n == 0 && event_of(p, &items[0]) >= 0))
        return evlist_extend(p, c, items, n);
    if (c->n == 0 && n < PICKLER_BATCH) {
        /* The frames list of an event: frame dicts in, an interned sequence out (valid frames hold
         * scalars only: depth 2). */
        int32_t sid;
        int rc = seq_intern(p, items, n, &sid);
        if (rc < 0) return -1;
        if (rc == 1) {
            c = &p->conts[ci];
            if (c->depth < 2) c->depth = 2;
            c->kind = C_SEQ;
            c->ref = sid;
            c->n = (uint32_t)n;
            return 0;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (consume(p, c, &items[i]) < 0) return GIVE_UP(-1);
    return cont_append(p, ci, items, n);
}

/* ------------------------------------------------------------------------- */
/* the opcode loop                                                            */

#define NEED(k)                                                                                                   \
    do {                                                                                                          \
        if (p->size - p->pos < (size_t)(k)) return GIVE_UP(-1);                                                            \
    } while (0)

static int new_str(P *p, size_t n, Val *v) {
    NEED(n);
    if (n > UINT32_MAX) return GIVE_UP(-1);
    const unsigned char *s = p->buf + p->pos;
    if (!utf8_ok(s, n)) return GIVE_UP(-1);
    v->kind = V_STR;
    v->len = (uint32_t)n;
    v->x = (int64_t)p->pos;
    v->key = n <= 16 ? key_of(s, n) : K_NONE;
    p->pos += n;
    return 0;
}

/* A LONG1 of n (1..8) bytes at s, with 8 bytes readable there: one 8-byte load, whose n wanted bytes are its
 * low ones; shifting them to the top and back (arithmetic shift, as gcc and clang do it) extends the sign. */
static inline int64_t long1_loaded(const unsigned char *s, size_t n) {
    uint64_t u;
    memcpy(&u, s, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    u = __builtin_bswap64(u);
#endif
    return (int64_t)(u << (64 - 8 * n)) >> (64 - 8 * n);
}

/* LONG1/LONG4: little-endian two's complement; only values that fit int64 are taken. */
static int new_long(P *p, size_t n, Val *v) {
    NEED(n);
    const unsigned char *s = p->buf + p->pos;
    p->pos += n;
    v->kind = V_INT;
    if (n == 0) {
        v->x = 0;
        return 0;
    }
    if (n == 9 && s[8] == 0) { /* [0, 2**64): 2**64 - 1 is torch's "no line" */
        uint64_t u = 0;
        for (size_t i = 0; i < 8; i++) u |= (uint64_t)s[i] << (8 * i);
        v->kind = u >> 63 ? V_UINT : V_INT;
        v->x = (int64_t)u;
        return 0;
    }
    if (n > 8) return GIVE_UP(-1); /* past int64 and uint64: only the reference reads such ints */
    uint64_t u = 0;
    for (size_t i = 0; i < n; i++) u |= (uint64_t)s[i] << (8 * i);
    if (n < 8 && (s[n - 1] & 0x80)) u |= ~0ULL << (8 * n);
    v->x = (int64_t)u;
    return 0;
}

static uint32_t rd32(const unsigned char *s) {
    return (uint32_t)s[0] | (uint32_t)s[1] << 8 | (uint32_t)s[2] << 16 | (uint32_t)s[3] << 24;
}
static uint64_t rd64(const unsigned char *s) { return (uint64_t)rd32(s) | (uint64_t)rd32(s + 4) << 32; }

/* A memo entry in 4 bytes (the memo holds an entry per container and per string a file memoizes: millions):
 * 0 empty; 1..MEMO_KEY-1 the container index + 1; MEMO_KEY | k a known string K_* (all of them have the
 * same bytes: the first one met stands for every one); MEMO_SEQ | s the frames list read without a container
 * (V_SEQ) of sequence s; MEMO_EVENT | e the event read without a container (V_EVENT) of record e;
 * MEMO_OVER | i the value over[i], anything else. */
#define MEMO_KEY 0x80000000u
#define MEMO_SEQ 0x90000000u
#define MEMO_SEQS (MEMO_EVENT - MEMO_SEQ) /* sequences past these are read with a container */
#define MEMO_EVENT 0xA0000000u
#define MEMO_OVER 0xC0000000u
#define MEMO_EVENTS (MEMO_OVER - MEMO_EVENT) /* records past these are read with a container */

static int memo_enc(P *p, const Val *v, uint32_t *out) {
    if (v->kind == V_CONT && v->x < (int64_t)MEMO_KEY - 1) {
        *out = (uint32_t)v->x + 1;
        return 0;
    }
    if (v->kind == V_STR && v->key != K_NONE) {
        if (p->key_val[v->key].kind == V_EMPTY) p->key_val[v->key] = *v;
        *out = MEMO_KEY | v->key;
        return 0;
    }
    if (v->kind == V_EVENT || v->kind == V_SEQ) { /* (x < MEMO_EVENTS, MEMO_SEQS: event_fast made it so) */
        *out = (v->kind == V_EVENT ? MEMO_EVENT : MEMO_SEQ) | (uint32_t)v->x;
        return 0;
    }
    if (p->over_n >= (MEMO_KEY >> 1) || grow((void **)&p->over, &p->over_cap, p->over_n + 1, sizeof(Val)) < 0)
        return GIVE_UP(-1);
    p->over[p->over_n] = *v;
    *out = MEMO_OVER | (uint32_t)p->over_n++;
    return 0;
}

/* The value of a non-empty memo entry, written straight into its slot (not through a temporary: a 16-byte
 * load of fields just stored one by one stalls). */
static inline __attribute__((always_inline)) void memo_dec(const P *p, uint32_t m, Val *d) {
    if (m < MEMO_KEY) {
        d->kind = V_CONT, d->key = 0, d->pad = 0, d->len = 0, d->x = (int64_t)(m - 1);
    } else if (m < MEMO_SEQ) {
        *d = p->key_val[(uint8_t)m];
    } else if (m < MEMO_EVENT) {
        d->kind = V_SEQ, d->key = 0, d->pad = 0, d->len = 0, d->x = (int64_t)(m - MEMO_SEQ);
    } else if (m < MEMO_OVER) {
        d->kind = V_EVENT, d->key = 0, d->pad = 0, d->len = 0, d->x = (int64_t)(m - MEMO_EVENT);
    } else
        *d = p->over[m & ~MEMO_OVER];
}

static int memo_put(P *p, size_t idx) {
    if (p->sn <= fence(p)) return GIVE_UP(-1);
    /* the pickler numbers its memo 0, 1, 2...: a far index is a hostile file */
    if (idx > p->memo_len + 1024) return GIVE_UP(-1);
    if (idx >= p->memo_cap) {
        size_t old = p->memo_cap;
        if (grow((void **)&p->memo, &p->memo_cap, idx + 1, sizeof(uint32_t)) < 0) return GIVE_UP(-1);
        memset(p->memo + old, 0, (p->memo_cap - old) * sizeof(uint32_t));
    }
    uint32_t m;
    if (memo_enc(p, &p->stack[p->sn - 1], &m) < 0) return -1;
    if (p->memo[idx] == 0)
        p->memo_len++;
    else
        p->memo_rewritten = 1;
    p->memo[idx] = m;
    return 0;
}

static int make_tuple(P *p, size_t from) {
    Val t;
    if (new_cont(p, C_TUPLE, &t) < 0) return GIVE_UP(-1);
    Cont *c = &p->conts[t.x];
    size_t k = p->sn - from;
    /* Snapshots hold flat tuples only (pool ids): a container in a tuple is the reference's to judge. */
    for (size_t i = from; i < p->sn; i++)
        if (IS_REF(p->stack[i].kind)) return GIVE_UP(-1);
    if (k && cont_append(p, t.x, p->stack + from, k) < 0) return GIVE_UP(-1);
    c->sealed = 1;
    p->sn = from;
    return push(p, t);
}

static int pop_mark(P *p, size_t *x) {
    if (!p->mn) return GIVE_UP(-1);
    *x = p->marks[--p->mn];
    return 0;
}

/* Frames: the reference unpickles from a file, and the C unpickler then drops the rest of a
 * frame when an opcode runs past its end (it reads the opcode's argument from after the frame),
 * where unpickling the same bytes from memory would not. A pickler never writes such a file, so
 * every opcode must lie inside its frame (or outside all frames), and a FRAME may only start
 * where the previous one ended: then both ways of reading agree, and so does this one. */
/* One opcode (read already, p->pos past it): -1 give up, 0 go on, 1 STOP. The frequent ones are
 * handled inline in run(); this is everything else. */
static int slow_op(P *p, unsigned char op, int *in_frame_, size_t *frame_end_) {
    Val v;
    memset(&v, 0, sizeof(v));
    int in_frame = *in_frame_;
    size_t frame_end = *frame_end_;
    switch (op) {
        case 'q': /* BINPUT */
            NEED(1);
            if (memo_put(p, p->buf[p->pos]) < 0) return GIVE_UP(-1);
            p->pos += 1;
            break;
        case 'r': /* LONG_BINPUT */
            NEED(4);
            if (memo_put(p, rd32(p->buf + p->pos)) < 0) return GIVE_UP(-1);
            p->pos += 4;
            break;
        case ')': /* EMPTY_TUPLE */
            if (make_tuple(p, p->sn) < 0) return GIVE_UP(-1);
            break;
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: /* TUPLE3 */
        {
            size_t k = op - 0x84;
            if (p->sn < fence(p) + k) return GIVE_UP(-1);
            if (make_tuple(p, p->sn - k) < 0) return GIVE_UP(-1);
            break;
        }
        case 't': /* TUPLE */
        {
            size_t x;
            if (pop_mark(p, &x) < 0 || make_tuple(p, x) < 0) return GIVE_UP(-1);
            break;
        }
        case 'a': /* APPEND */
        {
            if (p->sn < fence(p) + 2) return GIVE_UP(-1);
            Val list = p->stack[p->sn - 2];
            if (list.kind != V_CONT || list_extend(p, list.x, &p->stack[p->sn - 1], 1) < 0) return GIVE_UP(-1);
            p->sn -= 1;
            break;
        }
        case 's': /* SETITEM */
        {
            if (p->sn < fence(p) + 3) return GIVE_UP(-1);
            Val d = p->stack[p->sn - 3];
            if (d.kind != V_CONT || dict_set(p, d.x, &p->stack[p->sn - 2], 1) < 0) return GIVE_UP(-1);
            p->sn -= 2;
            break;
        }
        case 0x8b: /* LONG4 */
            NEED(4);
            {
                int32_t n = (int32_t)rd32(p->buf + p->pos);
                p->pos += 4;
                if (n < 0 || new_long(p, (size_t)n, &v) < 0 || push(p, v) < 0) return GIVE_UP(-1);
            }
            break;
        case 'X': /* BINUNICODE */
            NEED(4);
            {
                size_t n = rd32(p->buf + p->pos);
                p->pos += 4;
                if (new_str(p, n, &v) < 0 || push(p, v) < 0) return GIVE_UP(-1);
            }
            break;
        case 0x8d: /* BINUNICODE8 */
            NEED(8);
            {
                uint64_t n = rd64(p->buf + p->pos);
                p->pos += 8;
                if (n > p->size || new_str(p, (size_t)n, &v) < 0 || push(p, v) < 0) return GIVE_UP(-1);
            }
            break;
        case 0x95: /* FRAME: where the previous one ended, and within the file */
            NEED(8);
            if (in_frame) return GIVE_UP(-1);
            {
                uint64_t n = rd64(p->buf + p->pos);
                p->pos += 8;
                if (n > p->size - p->pos) return GIVE_UP(-1);
                *frame_end_ = p->pos + (size_t)n;
                *in_frame_ = 1;
            }
            break;
        case '0': /* POP */
            if (p->sn <= fence(p)) return GIVE_UP(-1);
            p->sn--;
            break;
        case '.': /* STOP: exactly one value, no open mark, and the last byte of the file (and of its frame) */
            if (p->sn != 1 || p->mn || p->pos != p->size || (in_frame && frame_end != p->size)) return GIVE_UP(-1);
            return 1;
        default:
            return GIVE_UP(-1); /* anything else (globals, reduce, bytes, protocol 0/1 text...) is the reference's */
    }
    return 0;
}

static uint64_t hash_bytes(const unsigned char *s, size_t n) {
    uint64_t h0 = 0x9e3779b97f4a7c15ULL ^ n, h1 = 0xbf58476d1ce4e5b9ULL, w;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        memcpy(&w, s + i, 8);
        h0 = (h0 ^ w) * 0x100000001b3ULL;
        memcpy(&w, s + i + 8, 8);
        h1 = (h1 ^ w) * 0x100000001b3ULL;
    }
    for (; i < n; i++) h1 = (h1 ^ s[i]) * 0x100000001b3ULL;
    return mix(h0 ^ mix(h1));
}

/* ------------------------------------------------------------------------- */
/* the prefaulter: the parse's pages made present before it writes them        */

/* The arrays the parse fills (containers, the memo, the event columns) are allocated up front for the
 * whole file, and their pages come into being as the parse first writes them: ~46k page faults on the
 * 460 MB benchmark, a third of the read's time on this VM, all on the one thread that reads. A helper
 * thread keeps the next stretch of each array present instead (madvise MADV_POPULATE_WRITE: the kernel
 * makes the pages and writes nothing into them), a fixed number of items ahead of what the parse has
 * published (fewer near the input's end, at the pace of the stretch read last: pf_ahead), so at most that much
 * more memory is made than the parse uses. The gunzip's output, whose
 * size the gzip trailer states, is made present whole, from its start, while libdeflate fills it: never
 * more than the caps already let it allocate (a trailer that states more than the stream holds gets
 * pages nobody writes, within those caps, until libdeflate refuses the stream).
 * The helper only ever calls madvise on the ranges it was given: a call on a range the parse has since
 * moved away from (an array grown by realloc) fails or makes pages nobody reads, and changes no byte.
 * Where the kernel has no MADV_POPULATE_WRITE (before Linux 5.14), no thread can start, or
 * OOMSCOPE_NO_PREFAULT is set (tests compare both), the parse faults its pages itself. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
enum { PF_CONTS, PF_MEMO, PF_EVENTS, PF_WHOLE, PF_COUNTS }; /* PF_WHOLE: a region made present whole */
#define PF_MAX 12
#define PF_STEP ((size_t)256 << 10) /* the least stretch one madvise makes present */
#define PF_MIN_INPUT ((size_t)16 << 20) /* smaller files: a thread costs about what their faults do */

typedef struct Prefault {
    char *start[PF_MAX]; /* page-aligned */
    size_t bytes[PF_MAX], width[PF_MAX], done[PF_MAX];
    size_t skip[PF_MAX]; /* bytes of the first item's page before start */
    int count_of[PF_MAX], n;
    size_t ahead[PF_COUNTS];
    size_t count[PF_COUNTS]; /* published by the parse (atomic) */
    size_t at, size;         /* the parse's place in its input (published with the counts), the input's size */
    /* two earlier publications, 8 MB of input or more apart: the pace is that of the stretch read since the older */
    size_t base_at, base_count[PF_COUNTS], mid_at, mid_count[PF_COUNTS];
    int stop;                /* set by the parse when it is done (atomic) */
    pthread_t thread;
} Prefault;

static void pf_add(Prefault *f, void *base, size_t items, size_t width, int count_of) {
    if (!base || f->n == PF_MAX) return;
    uintptr_t b = (uintptr_t)base, page = 4096, s = (b + page - 1) & ~(page - 1), e = (b + items * width) & ~(page - 1);
    if (e <= s) return;
    int i = f->n++;
    f->start[i] = (char *)s;
    f->bytes[i] = e - s;
    f->skip[i] = s - b;
    f->width[i] = width;
    f->done[i] = 0;
    f->count_of[i] = count_of;
}

/* Items to make present past `count` of kind c: f->ahead[c], but not more than the rest of the input holds at
 * the pace of the last stretch read (and half again): the arrays are sized for the worst case, and their pages
 * made ahead of the parse's end were made for nothing (~16 MB of them on the 460 MB benchmark, every one
 * a page the kernel cleared). */
static size_t pf_ahead(Prefault *f, int c, size_t count) {
    size_t at = __atomic_load_n(&f->at, __ATOMIC_RELAXED), ahead = f->ahead[c];
    if (at > f->base_at && count >= f->base_count[c] && at <= f->size) {
        double pace = (double)(count - f->base_count[c]) / (double)(at - f->base_at);
        double rest = (double)(f->size - at) * pace * 1.5 + 4096;
        if (rest < (double)ahead) ahead = (size_t)rest;
    }
    return ahead;
}

static void *pf_loop(void *arg) {
    Prefault *f = arg;
    for (;;) {
        size_t at = __atomic_load_n(&f->at, __ATOMIC_RELAXED);
        if (at >= f->mid_at + ((size_t)8 << 20)) {
            f->base_at = f->mid_at, f->mid_at = at;
            for (int c = 0; c < PF_COUNTS; c++) {
                f->base_count[c] = f->mid_count[c];
                f->mid_count[c] = __atomic_load_n(&f->count[c], __ATOMIC_RELAXED);
            }
        }
        int stop = __atomic_load_n(&f->stop, __ATOMIC_ACQUIRE), moved = 0;
        for (int i = 0; i < f->n; i++) {
            int c = f->count_of[i];
            size_t want, least = PF_STEP;
            if (c == PF_WHOLE) { /* a stretch at a time, from the start: ahead of the writer */
                want = f->bytes[i] - f->done[i] > PF_STEP ? f->done[i] + PF_STEP : f->bytes[i];
                least = 1; /* the last stretch may be shorter */
            } else {
                size_t count = __atomic_load_n(&f->count[c], __ATOMIC_RELAXED);
                want = (count + pf_ahead(f, c, count)) * f->width[i];
                want = want > f->skip[i] ? want - f->skip[i] : 0;
                if (want > f->bytes[i]) want = f->bytes[i];
                want &= ~(size_t)4095;
            }
            if (stop || want < f->done[i] + least) continue;
            if (madvise(f->start[i] + f->done[i], want - f->done[i], MADV_POPULATE_WRITE) != 0) {
                f->bytes[i] = 0; /* not supported, or the range went: leave this array to the parse */
                continue;
            }
            f->done[i] = want;
            moved = 1;
        }
        if (stop) return NULL;
        if (!moved) {
            /* 1 ms: the stretch ahead is ~20 ms of the parse; waking every 0.1 ms cost ~25 ms more CPU on the
             * 460 MB file (3000 wake-ups and their madvise calls), and no wall time was gained by it */
            struct timespec t = {0, 1000000};
            nanosleep(&t, NULL);
        }
    }
}

/* Bytes the prefaulter made present for the last parse of this thread (tests: that it ran). */
static _Thread_local size_t pf_made;

static Prefault *pf_new(void) {
    if (getenv("OOMSCOPE_NO_PREFAULT")) return NULL;
    return calloc(1, sizeof(Prefault));
}

static Prefault *pf_run(Prefault *f) {
    if (f && pthread_create(&f->thread, NULL, pf_loop, f) != 0) {
        free(f);
        return NULL;
    }
    return f;
}

/* Start the prefaulter on `bytes` at base, made present whole (NULL: none started). */
static Prefault *pf_whole(void *base, size_t bytes) {
    Prefault *f = bytes >= PF_MIN_INPUT ? pf_new() : NULL;
    if (f) pf_add(f, base, bytes, 1, PF_WHOLE);
    return pf_run(f);
}

/* Start the prefaulter on p's arrays as allocated now (NULL: none started). */
static Prefault *pf_start(P *p) {
    Prefault *f = pf_new();
    if (!f) return NULL;
    Events *ev = &p->ev;
    pf_add(f, p->conts, p->ccap, sizeof(Cont), PF_CONTS);
    pf_add(f, p->memo, p->memo_cap, sizeof(uint32_t), PF_MEMO);
    pf_add(f, ev->action, ev->cap, sizeof(*ev->action), PF_EVENTS);
    pf_add(f, ev->addr, ev->cap, sizeof(*ev->addr), PF_EVENTS);
    pf_add(f, ev->size, ev->cap, sizeof(*ev->size), PF_EVENTS);
    pf_add(f, ev->time, ev->cap, sizeof(*ev->time), PF_EVENTS);
    pf_add(f, ev->stream, ev->cap, sizeof(*ev->stream), PF_EVENTS);
    pf_add(f, ev->frames, ev->cap, sizeof(*ev->frames), PF_EVENTS);
    /* the pool column too, though the parse writes it only for events with a pool id (none in most files):
     * the export fills it (zeros where no event has one), on pages made here rather than faulted there */
    pf_add(f, ev->pool, ev->cap, sizeof(*ev->pool), PF_EVENTS);
    pf_add(f, ev->flags, ev->cap, sizeof(*ev->flags), PF_EVENTS);
    /* ~30 ms of the parse ahead at the benchmark's pace, less near the input's end (pf_ahead) */
    f->ahead[PF_CONTS] = 50000; /* (few: events and their frames lists are read without one) */
    f->ahead[PF_MEMO] = 600000;
    f->ahead[PF_EVENTS] = 200000;
    f->size = p->size;
    return pf_run(f);
}

/* The parse's counts, for the prefaulter: every 1024 dicts filled (until the first, they read zero and
 * the helper works from the arrays' starts). */
static inline void pf_publish(P *p) {
    Prefault *f = p->pf;
    __atomic_store_n(&f->count[PF_CONTS], p->cn, __ATOMIC_RELAXED);
    __atomic_store_n(&f->count[PF_MEMO], p->memo_len, __ATOMIC_RELAXED);
    __atomic_store_n(&f->count[PF_EVENTS], p->ev.n, __ATOMIC_RELAXED);
    __atomic_store_n(&f->at, p->pos, __ATOMIC_RELAXED);
}

static void pf_stop(Prefault *f) {
    if (!f) return;
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    pthread_join(f->thread, NULL);
    for (int i = 0; i < f->n; i++) pf_made += f->done[i];
    free(f);
}

/* span_seq (below) where its guess was not the span: `guess` the guess's slot (SIZE_MAX: none), given the
 * span found or made. */
static int span_walk(P *p, size_t pos, size_t stop_at, size_t *q_out, size_t *n_out, int32_t *sid, size_t guess) {
    const unsigned char *buf = p->buf;
    size_t q = pos, n = 0;
    /* The walk also makes the cheap key into span_recent, from the GETs' memo ids as it reads them (the bytes
     * read once, where a second pass over them made it before; a span whose bytes fall short of a word ended
     * in a partial load that stalled on its copy): four LONG_BINGETs at a time, their loads and multiplies
     * independent of each other, folded into the key by a rotate and an xor (no chain of multiplies). The key
     * only picks the span to compare first: the bytes are compared whole below. */
    uint64_t f = 0;
#if defined(__SSE2__)
    /* the four opcodes in one 16-byte load and compare (bytes 0, 5, 10, 15), the key from its two words and
     * the last GET's id */
    const __m128i jj = _mm_set1_epi8('j');
    while (stop_at - q >= 20 && n + 4 < PICKLER_BATCH) {
        __m128i w = _mm_loadu_si128((const __m128i *)(buf + q));
        if ((_mm_movemask_epi8(_mm_cmpeq_epi8(w, jj)) & 0x8421) != 0x8421) break;
        uint64_t lo = (uint64_t)_mm_cvtsi128_si64(w), hi = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(w, w));
        uint64_t d = rd32(buf + q + 16);
        f = ((f << 13) | (f >> 51)) ^ ((lo * 0x9e3779b97f4a7c15ULL + hi * 0xbf58476d1ce4e5b9ULL) ^ (d * 0x94d049bb133111ebULL));
        q += 20, n += 4;
    }
#else
    while (stop_at - q >= 20 && n + 4 < PICKLER_BATCH &&
           (buf[q] == 'j') & (buf[q + 5] == 'j') & (buf[q + 10] == 'j') & (buf[q + 15] == 'j')) {
        uint64_t a = rd32(buf + q + 1), b = rd32(buf + q + 6), c = rd32(buf + q + 11), d = rd32(buf + q + 16);
        f = ((f << 13) | (f >> 51)) ^ ((a * 0x9e3779b97f4a7c15ULL + b * 0xbf58476d1ce4e5b9ULL) ^
                                       (c * 0x94d049bb133111ebULL + d * 0x2545f4914f6cdd1dULL));
        q += 20, n += 4;
    }
#endif
    for (;;) {
        uint64_t id;
        if (q >= stop_at) return 0;
        if (buf[q] == 'j') {
            if (stop_at - q < 5) return 0;
            id = rd32(buf + q + 1) | (uint64_t)1 << 32;
            q += 5;
        } else if (buf[q] == 'h') {
            if (stop_at - q < 2) return 0;
            id = buf[q + 1];
            q += 2;
        } else
            break;
        f = ((f << 7) | (f >> 57)) ^ (id * 0xff51afd7ed558ccdULL);
        if (++n == PICKLER_BATCH) return 0;
    }
    if (n == 0 || buf[q] != 'e') return 0;
    size_t len = q - pos;
    /* the key into recent spans; a full hash into span_map when that is not it */
    uint64_t h = 0;
    size_t r = (size_t)(mix(f ^ len * 0xc4ceb9fe1a85ec53ULL) & (SPAN_RECENT - 1));
    if (!p->memo_rewritten) {
        int32_t i = p->span_recent[r] - 1;
        if (i >= 0 && p->span_len[i] == len && memcmp(p->span_at[i], buf + pos, len) == 0) {
            if (guess != SIZE_MAX) p->span_guess[guess] = i + 1;
            *sid = p->span_last = p->span_seq[i], *q_out = q, *n_out = n;
            return 1;
        }
        h = hash_bytes(buf + pos, len) & 0x7fffffffffffffffULL;
        for (;;) {
            int32_t i;
            if (!map_get(&p->span_map, h, &i)) break;
            if (p->span_len[i] == len && memcmp(p->span_at[i], buf + pos, len) == 0) {
                p->span_recent[r] = i + 1;
                if (guess != SIZE_MAX) p->span_guess[guess] = i + 1;
                *sid = p->span_last = p->span_seq[i], *q_out = q, *n_out = n;
                return 1;
            }
            h = (h + 1) & 0x7fffffffffffffffULL;
        }
    }
    int32_t ids[PICKLER_BATCH];
    for (size_t i = 0, r = pos; i < n; i++) {
        size_t id;
        if (buf[r] == 'j')
            id = rd32(buf + r + 1), r += 5;
        else
            id = buf[r + 1], r += 2;
        if (id >= p->memo_cap || p->memo[id] - 1 >= MEMO_KEY - 1) return 0; /* not a container (0 - 1 wraps) */
        ids[i] = (int32_t)(p->memo[id] - 1);
    }
    int rc = seq_intern_ids(p, ids, n, sid);
    if (rc != 1) return rc;
    if (!p->memo_rewritten) {
        size_t cap = p->span_cap;
        if (p->span_n >= INT32_MAX || grow((void **)&p->span_at, &cap, p->span_n + 1, sizeof(*p->span_at)) < 0)
            return GIVE_UP(-1);
        if (cap != p->span_cap) {
            uint32_t *a = realloc(p->span_len, cap * sizeof(uint32_t));
            if (!a) return GIVE_UP(-1);
            p->span_len = a;
            int32_t *b = realloc(p->span_seq, cap * sizeof(int32_t));
            if (!b) return GIVE_UP(-1);
            p->span_seq = b;
            uint32_t *c = realloc(p->span_items, cap * sizeof(uint32_t));
            if (!c) return GIVE_UP(-1);
            p->span_items = c;
            p->span_cap = cap;
        }
        /* A span is compared whole with the one its key finds (1.6M times on the 460 MB trace, with 121
         * spans): against a copy in one small pool, in cache, not against its first bytes in the file,
         * far behind the parse and cold. The pool stops at SPAN_POOL bytes (a file of many distinct
         * spans compares with the file's bytes, costing no memory of its own). */
        const unsigned char *at = buf + pos;
        if (len < SPAN_POOL - p->span_pool_n && (p->span_pool || (p->span_pool = malloc(SPAN_POOL)))) {
            at = memcpy(p->span_pool + p->span_pool_n, at, len + 1); /* (its APPENDS too: compared above) */
            p->span_pool_n += len + 1;
        }
        p->span_at[p->span_n] = at;
        p->span_len[p->span_n] = (uint32_t)len;
        p->span_seq[p->span_n] = *sid;
        p->span_items[p->span_n] = (uint32_t)n;
        if (guess != SIZE_MAX) p->span_guess[guess] = (int32_t)p->span_n + 1;
        p->span_recent[r] = (int32_t)p->span_n + 1;
        if (map_put(&p->span_map, h, (int32_t)p->span_n++) < 0) return GIVE_UP(-1);
    }
    *q_out = q, *n_out = n, p->span_last = *sid;
    return 1;
}

/* The frames list whose items start at buf[pos]: (BINGET | LONG_BINGET)... APPENDS, fewer than PICKLER_BATCH
 * items, all frame dicts. 1: interned as sequence *sid (*q: the APPENDS, *n: the items); 0: another shape,
 * nothing done; -1: give up. The same bytes are the same memo entries, so they are the same sequence for
 * as long as no memo entry is overwritten (a pickler never does): those are looked up by their bytes,
 * without reading the memo. Inline in the events' walk (the guess below, then span_walk where it was not
 * the span: a call and its saved registers cost more than the guess). */
static inline __attribute__((always_inline)) int span_seq(P *p, size_t pos, size_t stop_at, size_t *q_out,
                                                          size_t *n_out, int32_t *sid) {
    /* First a guess, without the walk: the span that last came after the same span as this one and began
     * with the same bytes 0-15 and 32-47 (the innermost frames are the allocator's, shared by most lists;
     * the one before tells most of the rest: 96% of the 460 MB trace's 1.6M spans are the guess). Its bytes
     * and the APPENDS after them, compared whole: the same bytes are the same GETs up to the same APPENDS
     * (what the walk below would find), of the same memo entries while the memo is not rewritten, so the
     * same sequence (the walk and its key cost more than the compare). */
    size_t guess = SIZE_MAX;
    const unsigned char *buf = p->buf;
    if (!p->memo_rewritten && stop_at - pos >= 48) {
        uint64_t w[4];
        memcpy(&w[0], buf + pos, 16), memcpy(&w[2], buf + pos + 32, 16);
        guess = (size_t)(mix((w[0] * 0x9e3779b97f4a7c15ULL ^ w[1]) + (w[2] * 0x94d049bb133111ebULL ^ w[3]) +
                             (uint64_t)(uint32_t)p->span_last * 0xbf58476d1ce4e5b9ULL) &
                         (SPAN_RECENT - 1));
        int32_t i = p->span_guess[guess] - 1;
        if (i >= 0) {
            size_t len = p->span_len[i];
            if (stop_at - pos > len && memcmp(p->span_at[i], buf + pos, len + 1) == 0) {
                *sid = p->span_last = p->span_seq[i], *q_out = pos + len, *n_out = p->span_items[i];
                return 1;
            }
        }
    }
    return span_walk(p, pos, stop_at, q_out, n_out, sid, guess);
}

/* A frames list's container made the interned sequence sid of n items (span_seq found it). */
static inline void list_to_seq(Cont *c, int32_t sid, size_t n) {
    if (c->depth < 2) c->depth = 2;
    c->kind = C_SEQ;
    c->ref = sid;
    c->n = (uint32_t)n;
}

/* The memo index a GET at pos reads (BINGET 'h', LONG_BINGET 'j', wholly before stop_at) into *idx, and its
 * length in bytes; 0 where pos holds no whole GET. */
static inline size_t get_at(const unsigned char *buf, size_t pos, size_t stop_at, size_t *idx) {
    if (pos < stop_at && buf[pos] == 'j' && stop_at - pos >= 5) {
        *idx = rd32(buf + pos + 1);
        return 5;
    }
    if (pos < stop_at && buf[pos] == 'h' && stop_at - pos >= 2) {
        *idx = buf[pos + 1];
        return 2;
    }
    return 0;
}

/* The values an event's fast walk holds for a hand-back: 32 pairs (torch writes 9 to 11). */
#define EV_FAST_VALS 64

/* An int opcode at s as the walk below reads it (BININT1, BININT2, BININT, LONG1 of 1..8 bytes; 10 bytes
 * readable at s) into *v: its length, 0 for any other opcode. */
static inline __attribute__((always_inline)) size_t int_op(const unsigned char *s, Val *v) {
    int64_t x;
    size_t len;
    switch (s[0]) {
    case 'K':
        x = s[1], len = 2;
        break;
    case 'M':
        x = (int64_t)s[1] | (int64_t)s[2] << 8, len = 3;
        break;
    case 'J':
        x = (int32_t)rd32(s + 1), len = 5;
        break;
    case 0x8a:
        if (s[1] < 1 || s[1] > 8) return 0;
        x = long1_loaded(s + 2, s[1]), len = 2 + (size_t)s[1];
        break;
    default:
        return 0;
    }
    v->kind = V_INT, v->key = 0, v->pad = 0, v->len = 0, v->x = x;
    return len;
}

/* The bytes a pair needs ahead for ev_pairs_fast: a 5-byte key GET, then a value of at most 10 (LONG1 of 8),
 * with LONG1's 8-byte load past its length byte. */
#define EV_PAIR_ROOM 24

/* A memo reference at q (BINGET 'h' with a one-byte index, LONG_BINGET 'j' with four): its index into IDX, its
 * length into LEN; FAIL (the caller's way out of its fast path) where q is none or its index lies past the memo.
 * A macro, not a function: the two callers leave by a return and by a goto. */
#define MEMO_AT(q, IDX, LEN, FAIL)                                                                                \
    do {                                                                                                          \
        if ((q)[0] == 'j')                                                                                        \
            IDX = rd32((q) + 1), LEN = 5;                                                                         \
        else if ((q)[0] == 'h')                                                                                   \
            IDX = (q)[1], LEN = 2;                                                                                \
        else                                                                                                      \
            FAIL;                                                                                                 \
        if (IDX >= memo_cap) FAIL;                                                                                \
    } while (0)

/* The value of one pair of event record e (its key `key`, a GET just read; its value at t), where it is one of the
 * shapes torch writes (an int for addr, size, stream and time_us, or None for time_us; a GET of a known string
 * for action, of "" for user_metadata, of an event's frames list read before for frames; "N/A" MEMOIZE for
 * compile_context): taken into the record as event_fast's general way takes the same bytes (event_set and
 * consume), and into vals[nv..nv+1] with its key. Its bytes (1 and more), 0 for any other shape (nothing done),
 * -1 to give up. Inline: where the key is a constant (ev_pairs_fast's torch order) its switch folds away. */
static inline __attribute__((always_inline)) long ev_pair(P *p, const uint32_t *memo, size_t memo_cap, uint8_t key,
                                                          const unsigned char *t, size_t stop_at, Val *vals, size_t nv,
                                                          size_t e, Cont *parent, uint16_t *have, uint16_t *bad,
                                                          uint8_t *flags) {
    size_t idx, vl;
    Val v = {0};
    uint32_t g = 0; /* the memo entry of a GET value */
#define GET_AT(q, IDX, LEN) MEMO_AT(q, IDX, LEN, return 0)
#define TAKE(K)                                                                                                   \
    do {                                                                                                          \
        if (event_set(p, e, (K), v, have, bad, flags) < 0) return -1;                                             \
    } while (0)
    switch (key) {
    case K_ADDR:
        if (!(vl = int_op(t, &v))) return 0;
        TAKE(K_ADDR);
        break;
    case K_SIZE:
        if (!(vl = int_op(t, &v))) return 0;
        TAKE(K_SIZE);
        break;
    case K_STREAM:
        if (!(vl = int_op(t, &v))) return 0;
        TAKE(K_STREAM);
        break;
    case K_TIME:
        if (t[0] == 'N')
            v.kind = V_NONE, vl = 1;
        else if (!(vl = int_op(t, &v)))
            return 0;
        TAKE(K_TIME);
        break;
    case K_ACTION:
        GET_AT(t, idx, vl);
        if ((g = memo[idx]) - MEMO_KEY >= MEMO_SEQ - MEMO_KEY) return 0; /* a known string */
        memo_dec(p, g, &v);
        TAKE(K_ACTION);
        break;
    case K_UM: /* "": the default (any other text needs a side entry: the general way) */
        GET_AT(t, idx, vl);
        if ((g = memo[idx]) != (MEMO_KEY | K_EMPTYSTR)) return 0;
        memo_dec(p, g, &v);
        TAKE(K_UM);
        break;
    case K_CC: /* "N/A" MEMOIZE: the default, pickled afresh for every event */
        if (memcmp(t, "\x8c\x03N/A\x94", 6) != 0 || p->key_val[K_NA].kind != V_STR || p->memo_len >= memo_cap ||
            memo[p->memo_len])
            return 0;
        v.kind = V_STR, v.key = K_NA, v.len = 3, v.x = (int64_t)(t + 2 - p->buf), vl = 6;
        p->memo[p->memo_len++] = MEMO_KEY | K_NA;
        TAKE(K_CC);
        break;
    case K_FRAMES: /* its frames list, without a container (V_SEQ): read before (a GET), or new (span_seq) */
        if (t[0] == ']') {
            /* EMPTY_LIST MEMOIZE MARK GETs... APPENDS, as the general way reads it; where span_seq finds
             * no sequence, that way asks it again, for the same answer and no change (nothing was made) */
            size_t q, n;
            int32_t sid;
            if (t[1] != 0x94 || t[2] != '(' || p->memo_len >= memo_cap || memo[p->memo_len] || p->cn >= MEMO_KEY - 2)
                return 0;
            int found = span_seq(p, (size_t)(t + 3 - p->buf), stop_at, &q, &n, &sid);
            if (found < 0) return -1;
            if (found != 1 || (uint32_t)sid >= MEMO_SEQS) return 0;
            v.kind = V_SEQ, v.x = sid, vl = q + 1 - (size_t)(t - p->buf);
            p->memo[p->memo_len++] = MEMO_SEQ | (uint32_t)sid;
        } else {
            GET_AT(t, idx, vl);
            if ((g = memo[idx]) - MEMO_SEQ >= MEMO_EVENT - MEMO_SEQ) return 0;
            memo_dec(p, g, &v);
        }
        if (consume(p, parent, &v) < 0) return -1;
        TAKE(K_FRAMES);
        break;
    default:
        return 0;
    }
#undef TAKE
#undef GET_AT
    vals[nv] = p->key_val[key];
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    {
        /* the value in two word stores (its fields are in registers here; five stores were the loop's most) */
        uint64_t w = (uint64_t)v.kind | (uint64_t)v.key << 8 | (uint64_t)v.pad << 16 | (uint64_t)v.len << 32;
        memcpy(&vals[nv + 1], &w, 8);
        memcpy((char *)&vals[nv + 1] + 8, &v.x, 8);
    }
#else
    vals[nv + 1] = v;
#endif
    return (long)vl;
}

/* An event record's pairs from pos on, for as long as each is one of the shapes ev_pair takes and lies with
 * EV_PAIR_ROOM bytes to spare before stop_at: each into vals[*nv..] and the record (one dispatch a pair where
 * event_fast's general way has two, and its state in registers). An event's first pairs are tried in the order
 * torch writes its keys (action, addr, size, stream, time_us, compile_context, user_metadata, frames), each key
 * checked to be the one expected: the dispatch on the key then folds away (the indirect jump on it was the
 * walk's most sampled instruction); from the first other key on, the keys are dispatched as read. The bytes
 * taken (*nv and the record's bits moved on past them), or -1 to give up. */
static inline __attribute__((always_inline)) long ev_pairs_fast(P *p, size_t pos, size_t stop_at, Val *vals,
                                                                size_t *nv_, size_t e, Cont *parent, uint16_t *have_,
                                                                uint16_t *bad_, uint8_t *flags_) {
    if (stop_at - pos < EV_PAIR_ROOM) return 0;
    const unsigned char *const s0 = p->buf + pos, *const end = p->buf + stop_at - EV_PAIR_ROOM;
    const unsigned char *s = s0;
    const uint32_t *const memo = p->memo; /* (neither moves while an event is read) */
    const size_t memo_cap = p->memo_cap;
    size_t nv = *nv_, idx, kl;
    uint16_t have = *have_, bad = *bad_;
    uint8_t flags = *flags_;
    long vl = 0;
#define KEY_AT(q, IDX, LEN) MEMO_AT(q, IDX, LEN, goto done)
#define PAIR(K)                                                                                                   \
    do {                                                                                                          \
        vl = ev_pair(p, memo, memo_cap, (K), s + kl, stop_at, vals, nv, e, parent, &have, &bad, &flags);        \
        if (vl <= 0) goto done;                                                                                   \
        s += kl + (size_t)vl;                                                                                     \
        nv += 2;                                                                                                  \
    } while (0)
#define EXPECT(K)                                                                                                 \
    do {                                                                                                          \
        if (s > end) goto done;                                                                                   \
        KEY_AT(s, idx, kl);                                                                                       \
        if (memo[idx] != (MEMO_KEY | (K))) goto any;                                                              \
        PAIR(K);                                                                                                  \
    } while (0)
    if (nv == 0) {
        EXPECT(K_ACTION);
        EXPECT(K_ADDR);
        EXPECT(K_SIZE);
        EXPECT(K_STREAM);
        EXPECT(K_TIME);
        EXPECT(K_CC);
        EXPECT(K_UM);
        EXPECT(K_FRAMES);
    }
any:
    while (s <= end && nv + 2 <= EV_FAST_VALS) {
        KEY_AT(s, idx, kl);
        const uint32_t m = memo[idx];
        if (m - MEMO_KEY >= 32u) goto done; /* a known string (K_* < 32) */
        PAIR((uint8_t)m);
    }
#undef EXPECT
#undef PAIR
#undef KEY_AT
#undef MEMO_AT
done:
    *nv_ = nv, *have_ = have, *bad_ = bad, *flags_ = flags;
    return vl < 0 ? GIVE_UP(-1) : (long)(s - s0);
}

/* An event dict's items, walked straight into its record: the MARK after an empty, unsealed dict was just
 * read (pos is past it), or (`slot` not SIZE_MAX) EMPTY_DICT MEMOIZE MARK, with no container made for the
 * dict and `slot` the memo entry its MEMOIZE takes. Torch writes every event as
 *     EMPTY_DICT MEMOIZE MARK (key value)... SETITEMS
 * with each key a GET of a memoized known string (its first is "action") and each value a GET, an int
 * (BININT1/BININT2/BININT/LONG1), None, the string "N/A" (MEMOIZE), or its frames list (EMPTY_LIST
 * MEMOIZE, then nothing or MARK GETs... APPENDS: span_seq). Where the general loop pushes each key and
 * value, then has SETITEMS hand them to dict_set, here each pair goes into the record as it is read
 * (event_set, consume: the same functions in the same order, so the same record), about half the
 * read's time per event.
 * On anything else, before its first byte, the walk hands back: the MARK is pushed and the pairs read
 * so far, as the general loop would have them, and the general loop goes on from that opcode. Whatever
 * the walk did by then is what the general loop does on the same bytes (containers, memo entries,
 * streams, sealed values), but the event record, which the general loop makes only at SETITEMS: it is
 * given back (no other record can have been made since). Values that need a record's side entry
 * (device_free, texts that are not the defaults) are handed back before they are set, so a given-back
 * record never left one. Every opcode taken lies wholly before stop_at (the frame's end): the general
 * loop handles the boundary.
 * Without a container (the usual: 12 bytes and a page fault per 340 events saved), a dict read whole
 * is a V_EVENT pushed, its memo entry MEMO_EVENT | its record; one handed back gets its container
 * then (its index is not the one the general loop gives it: nothing depends on the order of indices),
 * and its memo entry, which nothing read before (a GET of it hands back: its container is then read
 * into itself, which the general loop gives up on). A contless event read whole is followed by the next one
 * where EMPTY_DICT MEMOIZE MARK GET come next (each pushed as the general loop's calls one by one would push
 * it). 1: done (p->pos past the last SETITEMS), 0: handed back (p->pos, p->sn, the marks: the events before
 * it done), -1: give up. */
static int event_fast(P *p, size_t pos, size_t stop_at, size_t slot) {
    const unsigned char *buf = p->buf;
    Events *ev = &p->ev;
    const int contless = slot != SIZE_MAX;
    const int64_t ci = contless ? -1 : p->stack[p->sn - 1].x;
    Cont self; /* the dict's depth, without a container */
    Val vals[EV_FAST_VALS];
    size_t nv, at;
    int64_t e;
    uint16_t have, bad;
    uint8_t flags;
next: /* (a contless event, the one before it read whole: see the end) */
    self = (Cont){.kind = C_DICT, .depth = 1, .ref = -1};
    nv = 0, at = pos, e = -1, have = 0, bad = 0, flags = F_CC_DEFAULT | F_UM_DEFAULT;
    /* The file's bytes a kilobyte ahead asked into the cache (an event is ~190 bytes: four lines cover it):
     * the walk reads the file once, in order, and stalled on each new line (a quarter of span_seq's samples
     * sat on its first load of the bytes). A prefetch never faults, past the end of the bytes included (an
     * address there, not a pointer). Each line once, from a remembered next line, measured no better. */
    for (int l = 0; l < 4; l++) __builtin_prefetch((const void *)((uintptr_t)buf + pos + 1024 + 64 * l));
    { /* the first key must be "action" (a GET of it): else (a frame dict, a segment, the root...) nothing is done */
        size_t idx = SIZE_MAX;
        get_at(buf, pos, stop_at, &idx);
        if (idx >= p->memo_cap || p->memo[idx] != (MEMO_KEY | K_ACTION)) goto back;
    }
    /* (the loop's first key is that "action": its record is made here, where the loop made it on that key) */
    if ((e = ev_new(ev)) < 0) return -1;
    for (;;) {
        /* Pairs as torch writes them (ev_pairs_fast), then one the general way (or SETITEMS), below. */
        Cont *parent = contless ? &self : &p->conts[ci];
        long took = ev_pairs_fast(p, pos, stop_at, vals, &nv, (size_t)e, parent, &have, &bad, &flags);
        if (took < 0) return -1;
        pos += (size_t)took;
        /* a key, or SETITEMS */
        at = pos;
        if (pos >= stop_at || nv + 2 > EV_FAST_VALS) goto back;
        size_t idx, got = get_at(buf, pos, stop_at, &idx);
        unsigned char op = buf[pos];
        if (got)
            pos += got;
        else if (op == 'u') { /* (not the first: "action" was) */
            pos++;
            break;
        } else
            goto back;
        if (idx >= p->memo_cap || p->memo[idx] - MEMO_KEY >= 32u) goto back_at; /* a known string (K_* < 32) */
        uint8_t key = (uint8_t)p->memo[idx];
        Val *k = &vals[nv++];
        *k = p->key_val[key];
        /* its value */
        at = pos;
        if (pos >= stop_at) goto back;
        Val *v = &vals[nv];
        v->key = 0, v->pad = 0, v->len = 0;
        op = buf[pos];
        switch (op) {
        case 'j':
        case 'h': {
            if (!(got = get_at(buf, pos, stop_at, &idx))) goto back;
            if (idx >= p->memo_cap || p->memo[idx] == 0) goto back; /* (the general loop gives up) */
            memo_dec(p, p->memo[idx], v);
            pos += got;
            break;
        }
        case 'K':
            if (stop_at - pos < 2) goto back;
            v->kind = V_INT, v->x = buf[pos + 1];
            pos += 2;
            break;
        case 'M':
            if (stop_at - pos < 3) goto back;
            v->kind = V_INT, v->x = (int64_t)buf[pos + 1] | (int64_t)buf[pos + 2] << 8;
            pos += 3;
            break;
        case 'J':
            if (stop_at - pos < 5) goto back;
            v->kind = V_INT, v->x = (int32_t)rd32(buf + pos + 1);
            pos += 5;
            break;
        case 'N':
            v->kind = V_NONE, v->x = 0;
            pos += 1;
            break;
        case 0x8a: { /* LONG1 of 1..8 bytes, read as run() reads it */
            size_t n = stop_at - pos >= 2 ? buf[pos + 1] : 0;
            if (n < 1 || n > 8 || stop_at - pos < 2 + n || p->size - (pos + 2) < 8) goto back;
            v->kind = V_INT, v->x = long1_loaded(buf + pos + 2, n);
            pos += 2 + n;
            break;
        }
        case 0x8c: /* SHORT_BINUNICODE "N/A" MEMOIZE: every event's compile_context */
            if (stop_at - pos < 6 || memcmp(buf + pos + 1, "\x03N/A\x94", 5) != 0 || p->key_val[K_NA].kind != V_STR ||
                p->memo_len >= p->memo_cap || p->memo[p->memo_len])
                goto back;
            v->kind = V_STR, v->key = K_NA, v->len = 3, v->x = (int64_t)(pos + 2);
            p->memo[p->memo_len++] = MEMO_KEY | K_NA;
            pos += 6;
            break;
        case ']': { /* EMPTY_LIST MEMOIZE: the frames list */
            if (stop_at - pos < 2 || buf[pos + 1] != 0x94 || p->memo_len >= p->memo_cap || p->memo[p->memo_len] ||
                p->cn >= MEMO_KEY - 2)
                goto back;
            pos += 2;
            if (pos < stop_at && buf[pos] == '(') { /* its items: interned, without a container (V_SEQ) */
                size_t q, n;
                int32_t sid;
                /* (its memo entry is made after: a GET of it among its items is not a frame dict either way) */
                int rc = span_seq(p, pos + 1, stop_at, &q, &n, &sid);
                if (rc < 0) return -1;
                if (rc == 1 && (uint32_t)sid < MEMO_SEQS) {
                    v->kind = V_SEQ, v->x = sid;
                    p->memo[p->memo_len++] = MEMO_SEQ | (uint32_t)sid;
                    pos = q + 1;
                    break;
                }
            }
            int64_t li = cont_new(p, C_LIST);
            if (li < 0) return -1;
            v->kind = V_CONT, v->x = li;
            p->memo[p->memo_len++] = (uint32_t)li + 1;
            if (pos < stop_at && buf[pos] == '(') { /* another shape: the list is read the general way, from its MARK */
                nv++;
                at = pos;
                goto back;
            }
            break; /* an empty list */
        }
        default:
            goto back;
        }
        /* (K_* are below 32: one test of a mask for the three keys first) */
        if (((1u << (key & 31)) & (1u << K_DFREE | 1u << K_CC | 1u << K_UM)) &&
            (key == K_DFREE || !(v->kind == V_STR && v->key == (key == K_CC ? K_NA : K_EMPTYSTR)))) {
            nv++; /* set by the general loop (a side entry) */
            at = pos;
            goto back;
        }
        nv++;
        if (IS_REF(v->kind) && consume(p, contless ? &self : &p->conts[ci], v) < 0)
            return GIVE_UP(-1);
        if (event_set(p, (size_t)e, key, *v, &have, &bad, &flags) < 0) return GIVE_UP(-1);
    }
    if (contless) {
        /* (its depth in two bits: deeper ones, which no torch writes, are read with a container) */
        if (self.depth > 3 || (p->sn == p->scap && grow((void **)&p->stack, &p->scap, p->sn + 1, sizeof(Val)) < 0)) {
            at = pos - 1;
            goto back;
        }
        ev->flags[e] = ev_flags(ev, (size_t)e, have, bad, flags) | (uint8_t)(self.depth << F_DEPTH_SHIFT);
        p->memo[slot] = MEMO_EVENT | (uint32_t)e;
        Val *d = &p->stack[p->sn++];
        d->kind = V_EVENT, d->key = 0, d->pad = 0, d->len = 0, d->x = e;
    } else {
        Cont *c = &p->conts[ci];
        c->kind = C_EVENT;
        c->ref = (int32_t)e;
        c->n = (uint32_t)(nv / 2);
        ev->flags[e] = ev_flags(ev, (size_t)e, have, bad, flags);
    }
    p->pos = pos;
    if (p->pf && !(++p->pf_tick & 1023)) pf_publish(p);
    /* The next event's EMPTY_DICT MEMOIZE MARK and GET right after, taken as op_empty_dict takes them: read here,
     * not through a return to the general loop, its dispatch and a call again (torch writes up to 1000 events
     * in a row, between a MARK and their APPENDS) */
    if (contless && stop_at - pos > 4 && buf[pos] == '}' && buf[pos + 1] == 0x94 && buf[pos + 2] == '(' &&
        (buf[pos + 3] == 'j' || buf[pos + 3] == 'h') && p->memo_len < p->memo_cap && p->memo[p->memo_len] == 0 &&
        ev->n < MEMO_EVENTS) {
        slot = p->memo_len++;
        pos += 3;
        goto next;
    }
    return 1;
back_at: /* the key just read is handed back unread */
    pos = at;
back:
    if (e >= 0) ev->n--;
    if ((p->mn == p->mcap && grow((void **)&p->marks, &p->mcap, p->mn + 1, sizeof(size_t)) < 0) ||
        grow((void **)&p->stack, &p->scap, p->sn + nv + 1, sizeof(Val)) < 0)
        return GIVE_UP(-1);
    if (contless) { /* the dict's container, as EMPTY_DICT MEMOIZE would have made it */
        int64_t di = cont_new(p, C_DICT);
        if (di < 0 || di >= (int64_t)MEMO_KEY - 1) return GIVE_UP(-1);
        p->conts[di].depth = self.depth;
        p->memo[slot] = (uint32_t)di + 1;
        Val *d = &p->stack[p->sn++];
        d->kind = V_CONT, d->key = 0, d->pad = 0, d->len = 0, d->x = di;
    }
    p->marks[p->mn++] = p->sn;
    memcpy(p->stack + p->sn, vals, nv * sizeof(Val));
    p->sn += nv;
    p->pos = at;
    return 0;
}

static int run(P *p) {
    if (p->size < 2 || p->buf[0] != 0x80 || p->buf[1] < 2 || p->buf[1] > 5) return GIVE_UP(-1);
    /* The hot state in locals: stores of uint8_t fields alias everything, so fields of *p would be
     * reloaded after each. Synced with *p around anything that is not inline here. Dispatch is
     * threaded (one indirect jump per handler: the branch predictor learns each opcode's successor). */
    const unsigned char *buf = p->buf;
    const size_t size = p->size;
    size_t pos = 2, frame_end = 0, stop_at = size;
    int in_frame = 0;
    Val *stack = p->stack;
    uint32_t *memo = p->memo;
    size_t sn = p->sn, scap = p->scap, memo_cap = p->memo_cap, memo_len = p->memo_len, idx;
    Val v;
    static const void *table[256] = {
        [0 ... 255] = &&op_other, ['j'] = &&op_long_binget, ['h'] = &&op_binget, [0x94] = &&op_memoize,
        ['('] = &&op_mark, ['}'] = &&op_empty_dict, [']'] = &&op_empty_list, ['K'] = &&op_binint1,
        ['M'] = &&op_binint2, ['J'] = &&op_binint, [0x8a] = &&op_long1, [0x8c] = &&op_short_binunicode,
        ['G'] = &&op_binfloat, ['N'] = &&op_none, [0x88] = &&op_true, [0x89] = &&op_false,
        ['e'] = &&op_appends, ['u'] = &&op_setitems,
    };
#define SYNC_OUT() (p->pos = pos, p->sn = sn, p->memo_len = memo_len)
#define SYNC_IN()                                                                                                 \
    (pos = p->pos, sn = p->sn, stack = p->stack, scap = p->scap, memo = p->memo, memo_cap = p->memo_cap,          \
     memo_len = p->memo_len)
#define ROOM()                                                                                                    \
    do {                                                                                                          \
        if (__builtin_expect(sn == scap, 0)) {                                                                    \
            SYNC_OUT();                                                                                           \
            if (grow((void **)&p->stack, &p->scap, sn + 1, sizeof(Val)) < 0) return GIVE_UP(-1);                  \
            SYNC_IN();                                                                                            \
        }                                                                                                         \
    } while (0)
#define PUSH(val)                                                                                                 \
    do {                                                                                                          \
        ROOM();                                                                                                   \
        stack[sn++] = (val);                                                                                      \
    } while (0)
/* A value written field by field into its slot (see memo_dec). */
#define PUT(K, KEY, LEN, X)                                                                                       \
    do {                                                                                                          \
        ROOM();                                                                                                   \
        Val *d_ = &stack[sn++];                                                                                   \
        d_->kind = (K), d_->key = (KEY), d_->pad = 0, d_->len = (LEN), d_->x = (X);                               \
    } while (0)
#define ARG(k)                                                                                                    \
    do {                                                                                                          \
        if (__builtin_expect(size - pos < (size_t)(k), 0)) return GIVE_UP(-1);                                   \
    } while (0)
#define DISPATCH()                                                                                                \
    do {                                                                                                          \
        if (__builtin_expect(pos >= stop_at, 0)) goto boundary;                                                   \
        goto *table[buf[pos++]];                                                                                  \
    } while (0)
/* A pickler memoizes every container and string it writes, straight after it: a direct jump to MEMOIZE
 * (the same checks as DISPATCH's) instead of the table's. */
#define MEMOIZE_NEXT()                                                                                            \
    do {                                                                                                          \
        if (__builtin_expect(pos < stop_at, 1) && buf[pos] == 0x94) {                                             \
            pos++;                                                                                                \
            goto op_memoize;                                                                                      \
        }                                                                                                         \
    } while (0)
#define SCALAR(K, X)                                                                                              \
    do {                                                                                                          \
        PUT((K), 0, 0, (X));                                                                                      \
        DISPATCH();                                                                                               \
    } while (0)

    DISPATCH();
boundary:
    if (in_frame) {
        if (pos > frame_end) return GIVE_UP(-1); /* the last opcode crossed its frame's end */
        if (pos == frame_end) {
            in_frame = 0;
            stop_at = size;
            DISPATCH();
        }
    }
    return GIVE_UP(-1); /* the file ends without STOP */

op_long_binget:
    ARG(4);
    idx = rd32(buf + pos);
    pos += 4;
    goto get;
op_binget:
    ARG(1);
    idx = buf[pos++];
get:
    if (__builtin_expect(idx >= memo_cap || memo[idx] == 0, 0)) return GIVE_UP(-1);
    ROOM();
    memo_dec(p, memo[idx], &stack[sn++]);
    DISPATCH();
op_memoize:
    if (sn <= (p->mn ? p->marks[p->mn - 1] : 0)) return GIVE_UP(-1);
    if (__builtin_expect(memo_len >= memo_cap, 0)) {
        SYNC_OUT();
        if (memo_put(p, memo_len) < 0) return -1;
        SYNC_IN();
        DISPATCH();
    }
    {
        const Val *top = &stack[sn - 1];
        uint32_t m;
        if (top->kind == V_CONT && top->x < (int64_t)MEMO_KEY - 1)
            m = (uint32_t)top->x + 1;
        else if (top->kind == V_STR && top->key != K_NONE && p->key_val[top->key].kind == V_STR)
            m = MEMO_KEY | top->key;
        else if (memo_enc(p, top, &m) < 0)
            return -1;
        /* after a BINPUT past the count, the slot is taken: the reference overwrites it too */
        uint32_t was = memo[memo_len];
        memo[memo_len] = m;
        memo_len += was == 0;
        if (was) p->memo_rewritten = 1;
    }
    DISPATCH();
op_mark:
    /* The shape of every event's frames list: EMPTY_LIST MEMOIZE MARK (BINGET | LONG_BINGET)... APPENDS.
     * Intern the GETs' container ids (span_seq), without pushing anything;
     * on any other shape (or a sequence that is not all frame dicts) nothing was done, and the MARK
     * goes the general way. */
    if (sn > (p->mn ? p->marks[p->mn - 1] : 0) && stack[sn - 1].kind == V_CONT) {
        Cont *lc = &p->conts[stack[sn - 1].x];
        if (lc->kind == C_LIST && lc->n == 0 && !lc->sealed) {
            size_t q, n;
            int32_t sid;
            SYNC_OUT();
            int rc = span_seq(p, pos, stop_at, &q, &n, &sid);
            if (rc < 0) return -1;
            if (rc == 1) {
                list_to_seq(&p->conts[stack[sn - 1].x], sid, n);
                pos = q + 1;
                DISPATCH();
            }
        } else if (lc->kind == C_DICT && lc->n == 0 && !lc->sealed) {
            SYNC_OUT();
            if (event_fast(p, pos, stop_at, SIZE_MAX) < 0) return -1;
            SYNC_IN();
            DISPATCH();
        }
    }
    if (__builtin_expect(p->mn == p->mcap, 0) && grow((void **)&p->marks, &p->mcap, p->mn + 1, sizeof(size_t)) < 0)
        return GIVE_UP(-1);
    p->marks[p->mn++] = sn;
    DISPATCH();
op_empty_dict:
    /* EMPTY_DICT MEMOIZE MARK and a GET: an event's items, read without a container where they are one */
    if (pos + 3 < stop_at && buf[pos] == 0x94 && buf[pos + 1] == '(' && (buf[pos + 2] == 'j' || buf[pos + 2] == 'h') &&
        memo_len < memo_cap && memo[memo_len] == 0 && p->ev.n < MEMO_EVENTS) {
        SYNC_OUT();
        size_t slot = p->memo_len++;
        if (event_fast(p, pos + 2, stop_at, slot) < 0) return -1;
        SYNC_IN();
        DISPATCH();
    }
    idx = C_DICT;
    goto new_container;
op_empty_list:
    idx = C_LIST;
new_container: {
    int64_t ci = cont_new(p, (uint8_t)idx);
    if (ci < 0) return -1;
    PUT(V_CONT, 0, 0, ci);
    MEMOIZE_NEXT();
    DISPATCH();
}
op_binint1:
    ARG(1);
    pos += 1;
    SCALAR(V_INT, buf[pos - 1]);
op_binint2:
    ARG(2);
    pos += 2;
    SCALAR(V_INT, (int64_t)buf[pos - 2] | (int64_t)buf[pos - 1] << 8);
op_binint:
    ARG(4);
    pos += 4;
    SCALAR(V_INT, (int32_t)rd32(buf + pos - 4));
op_none:
    SCALAR(V_NONE, 0);
op_true:
    SCALAR(V_TRUE, 0);
op_false:
    SCALAR(V_FALSE, 0);
op_binfloat: {
    ARG(8);
    uint64_t u = 0;
    for (int i = 0; i < 8; i++) u = u << 8 | buf[pos + i];
    pos += 8;
    SCALAR(V_FLOAT, (int64_t)u);
}
op_long1:
    ARG(1);
    {
        size_t n = buf[pos++];
        if (n >= 1 && n <= 8 && size - pos >= 8) { /* the usual: an address or a time, sign-extended */
            int64_t x = long1_loaded(buf + pos, n);
            pos += n;
            SCALAR(V_INT, x);
        }
        if (n >= 1 && n <= 8 && size - pos >= n) {
            uint64_t u = 0;
            for (size_t i = 0; i < n; i++) u |= (uint64_t)buf[pos + i] << (8 * i);
            if (n < 8 && (buf[pos + n - 1] & 0x80)) u |= ~0ULL << (8 * n);
            pos += n;
            SCALAR(V_INT, (int64_t)u);
        }
        SYNC_OUT();
        if (new_long(p, n, &v) < 0) return -1;
        pos = p->pos;
        PUSH(v);
    }
    DISPATCH();
op_short_binunicode:
    ARG(1);
    {
        size_t n = buf[pos++];
        if (n == 3 && size - pos >= 3 && buf[pos] == 'N' && buf[pos + 1] == '/' && buf[pos + 2] == 'A') {
            /* every event's compile_context: pickled afresh each time */
            PUT(V_STR, K_NA, 3, (int64_t)pos);
            pos += 3;
            MEMOIZE_NEXT();
            DISPATCH();
        }
        SYNC_OUT();
        if (new_str(p, n, &v) < 0) return -1;
        pos = p->pos;
        PUSH(v);
    }
    DISPATCH();
op_appends: {
    size_t x;
    SYNC_OUT();
    if (pop_mark(p, &x) < 0 || x < 1 || x - 1 < fence(p)) return GIVE_UP(-1);
    Val list = p->stack[x - 1];
    if (list.kind != V_CONT || list_extend(p, list.x, p->stack + x, p->sn - x) < 0) return GIVE_UP(-1);
    p->sn = x;
    SYNC_IN();
    DISPATCH();
}
op_setitems: {
    size_t x;
    SYNC_OUT();
    if (p->pf && !(++p->pf_tick & 1023)) pf_publish(p);
    if (pop_mark(p, &x) < 0 || x < 1 || x - 1 < fence(p) || (p->sn - x) % 2) return GIVE_UP(-1);
    Val d = p->stack[x - 1];
    if (d.kind != V_CONT || dict_set(p, d.x, p->stack + x, (p->sn - x) / 2) < 0) return GIVE_UP(-1);
    p->sn = x;
    SYNC_IN();
    DISPATCH();
}
op_other: {
    SYNC_OUT();
    int was = in_frame;
    int rc = slow_op(p, buf[pos - 1], &in_frame, &frame_end);
    if (rc < 0) return -1;
    if (rc > 0) return 0;
    SYNC_IN();
    if (in_frame && !was) stop_at = frame_end < size ? frame_end : size;
    DISPATCH();
}
#undef SCALAR
#undef MEMOIZE_NEXT
#undef DISPATCH
#undef ARG
#undef PUSH
#undef SYNC_IN
#undef SYNC_OUT
}

/* ------------------------------------------------------------------------- */
/* export to Python                                                             */

static PyObject *export(P *p, const Val *v);

static PyObject *str_of(P *p, const Val *v) {
    return PyUnicode_DecodeUTF8((const char *)p->buf + v->x, v->len, "surrogatepass");
}

static PyObject *line_obj(const Val *v) {
    return v->kind == V_UINT ? PyLong_FromUnsignedLongLong((uint64_t)v->x) : PyLong_FromLongLong(v->x);
}

static PyObject *frame_dict(P *p, FrameRec *f) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int i = 0; i < 3; i++) {
        PyObject *x = f->order[i] == K_LINE       ? line_obj(&f->line)
                      : f->order[i] == K_FILENAME ? str_of(p, &f->filename)
                                                  : str_of(p, &f->name);
        const char *k = f->order[i] == K_LINE ? "line" : f->order[i] == K_FILENAME ? "filename" : "name";
        if (!x || PyDict_SetItemString(d, k, x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(x);
    }
    return d;
}

/* Python objects of the same container are the same object (the graph stays a DAG). */
static PyObject *frame_of_rec(P *p, int32_t rec, PyObject **cache) {
    if (!cache[rec]) cache[rec] = frame_dict(p, &p->frames[rec]);
    Py_XINCREF(cache[rec]);
    return cache[rec];
}

static PyObject *export_cont(P *p, int64_t ci) {
    int32_t hit;
    if (map_get(&p->cache_map, (uint64_t)ci, &hit)) {
        Py_INCREF(p->cache[hit]);
        return p->cache[hit];
    }
    Cont *c = &p->conts[ci];
    PyObject *o = NULL;
    switch (c->kind) {
    case C_LIST:
    case C_TUPLE:
        o = c->kind == C_LIST ? PyList_New(c->n) : PyTuple_New(c->n);
        if (!o) return NULL;
        for (uint32_t i = 0; i < c->n; i++) {
            PyObject *x = export(p, &ITEMS(p, c)[i]);
            if (!x) {
                Py_DECREF(o);
                return NULL;
            }
            if (c->kind == C_LIST)
                PyList_SET_ITEM(o, i, x);
            else
                PyTuple_SET_ITEM(o, i, x);
        }
        break;
    case C_SEQ:
        o = PyList_New(c->n);
        if (!o) return NULL;
        for (uint32_t i = 0; i < c->n; i++) {
            PyObject *x = frame_of_rec(p, p->conts[p->seqpool[p->seq_off[c->ref] + i]].ref, p->fcache);
            if (!x) {
                Py_DECREF(o);
                return NULL;
            }
            PyList_SET_ITEM(o, i, x);
        }
        break;
    case C_FRAME: {
        FrameRec *f = &p->frames[c->ref];
        if (frame_valid(p, c->ref) <= 0) return GIVE_UP(NULL); /* an odd frame-like dict: the reference reads it */
        o = frame_of_rec(p, c->ref, p->fcache);
        (void)f;
        break;
    }
    case C_DICT:
        o = PyDict_New();
        if (!o) return NULL;
        for (uint32_t i = 0; i < c->n; i++) {
            PyObject *k = export(p, &ITEMS(p, c)[2 * i]);
            PyObject *x = k ? export(p, &ITEMS(p, c)[2 * i + 1]) : NULL;
            if (!x || PyDict_SetItem(o, k, x) < 0) {
                Py_XDECREF(k);
                Py_XDECREF(x);
                Py_DECREF(o);
                return NULL;
            }
            Py_DECREF(k);
            Py_DECREF(x);
        }
        break;
    default:
        return GIVE_UP(NULL); /* an event record outside a trace */
    }
    if (o) {
        if (p->cache_n >= INT32_MAX || grow((void **)&p->cache, &p->cache_cap, p->cache_n + 1, sizeof(PyObject *)) < 0 ||
            map_put(&p->cache_map, (uint64_t)ci, (int32_t)p->cache_n) < 0) {
            Py_DECREF(o);
            return PyErr_NoMemory();
        }
        p->cache[p->cache_n++] = o;
        Py_INCREF(o);
    }
    return o;
}

static PyObject *export(P *p, const Val *v) {
    switch (v->kind) {
    case V_NONE:
        Py_RETURN_NONE;
    case V_TRUE:
        Py_RETURN_TRUE;
    case V_FALSE:
        Py_RETURN_FALSE;
    case V_INT:
        return PyLong_FromLongLong(v->x);
    case V_UINT:
        return PyLong_FromUnsignedLongLong((uint64_t)v->x);
    case V_FLOAT: {
        double d;
        uint64_t u = (uint64_t)v->x;
        memcpy(&d, &u, 8);
        return PyFloat_FromDouble(d);
    }
    case V_STR:
        return str_of(p, v);
    case V_CONT:
        return export_cont(p, v->x);
    case V_EVENT:
        return GIVE_UP(NULL); /* an event record outside a trace */
    case V_SEQ:
        return GIVE_UP(NULL); /* an event's frames list elsewhere too */
    }
    return NULL;
}


/* The bucketing rounds of convert.Converter.intern_event_stacks, on content
 * classes: the order in which it first asks stack_of for each class. */
static int stack_order(P *p, const int32_t *heads, size_t nh, PyObject *order) {
    /* heads: the frames lists (sequence ids) of the trace's run heads (each event with frames whose content
     * class is not the one of the event with frames before it), each once, in order of first appearance.
     * Each round's outcome for an element depends on its sequence alone (its class, middle frame dict and
     * length), and only a sequence's first element can be a round's first of its key: so the rounds over
     * the distinct sequences ask for the same classes in the same order as the rounds over every run head,
     * for a few hundred elements where those were a million. */
#define cls(j) p->seq_cls[j]
#define mid(j) p->seqpool[p->seq_off[j] + p->seq_len[j] / 2]
#define len(j) p->seq_len[j]
    int32_t *pending = malloc((nh + 1) * sizeof(int32_t));
    int32_t *next = malloc((nh + 1) * sizeof(int32_t));
    int32_t *rep_cls = malloc((nh + 1) * sizeof(int32_t));
    uint8_t *called = calloc(p->cls_n + 1, 1);
    Map keys = {0};
    int rc = -1;
    if (!pending || !next || !rep_cls || !called) goto out;
    size_t np_ = nh;
    memcpy(pending, heads, nh * sizeof(int32_t));
#define CALL(c)                                                                                                   \
    do {                                                                                                          \
        if (!called[c]) {                                                                                         \
            called[c] = 1;                                                                                        \
            PyObject *o_ = PyLong_FromLong(c);                                                                    \
            if (!o_ || PyList_Append(order, o_) < 0) {                                                            \
                Py_XDECREF(o_);                                                                                   \
                goto out;                                                                                         \
            }                                                                                                     \
            Py_DECREF(o_);                                                                                        \
        }                                                                                                         \
    } while (0)
    for (int round = 0; round < 8 && np_; round++) {
        if (map_init(&keys, np_) < 0) goto out;
        size_t nreps = 0;
        /* reps: the first pending element of each key, in order */
        for (size_t i = 0; i < np_; i++) {
            int32_t j = pending[i];
            uint64_t k = ((uint64_t)(uint32_t)mid(j) << 8) | (uint64_t)(len(j) < 255 ? len(j) : 255);
            int32_t r;
            if (!map_get(&keys, k, &r)) {
                if (map_put(&keys, k, (int32_t)nreps) < 0) goto out;
                rep_cls[nreps++] = cls(j);
                CALL(cls(j));
            }
        }
        size_t nn = 0;
        for (size_t i = 0; i < np_; i++) {
            int32_t j = pending[i];
            uint64_t k = ((uint64_t)(uint32_t)mid(j) << 8) | (uint64_t)(len(j) < 255 ? len(j) : 255);
            int32_t r = 0;
            map_get(&keys, k, &r);
            if (rep_cls[r] != cls(j)) next[nn++] = j;
        }
        map_free(&keys);
        int32_t *t = pending;
        pending = next;
        next = t;
        np_ = nn;
    }
    for (size_t i = 0; i < np_; i++) CALL(cls(pending[i]));
#undef CALL
#undef cls
#undef mid
#undef len
    rc = 0;
out:
    map_free(&keys);
    free(pending);
    free(next);
    free(rep_cls);
    free(called);
    return rc;
}

/* An event column handed to Python: it owns the column's buffer (malloc'd by the parse) and lends it
 * through the buffer protocol, so numpy views it where the parse wrote it. */
typedef struct {
    PyObject_HEAD void *buf;
    Py_ssize_t len;
} Column;

static void column_dealloc(PyObject *o) {
    free(((Column *)o)->buf);
    Py_TYPE(o)->tp_free(o);
}

static int column_getbuffer(PyObject *o, Py_buffer *view, int flags) {
    Column *c = (Column *)o;
    return PyBuffer_FillInfo(view, o, c->buf, c->len, 0, flags);
}

static PyBufferProcs column_as_buffer = {column_getbuffer, NULL};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "analysis._snapread.Column",
    .tp_basicsize = sizeof(Column),
    .tp_dealloc = column_dealloc,
    .tp_as_buffer = &column_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "an event column of a parse (a buffer)",
};


/* bytes [from, to) of event column k as a memoryview (the Column made on first use). */
static PyObject *column_slice(P *p, int k, size_t from, size_t to) {
    void **field[XC_N] = {(void **)&p->ev.action, (void **)&p->ev.addr,   (void **)&p->ev.size,
                          (void **)&p->ev.time,   (void **)&p->ev.frames, (void **)&p->ev.pool,
                          (void **)&p->ev.stream};
    static const size_t width[XC_N] = {1, 8, 8, 8, 4, 4, 4};
    if (!p->xcol[k]) {
        Column *c = PyObject_New(Column, &ColumnType);
        if (!c) return NULL;
        /* the records' room past the last one goes back (it may stay reserved as long as the Column) */
        void *q = realloc(*field[k], p->ev.n * width[k]);
        if (q) *field[k] = q;
        c->buf = *field[k];
        c->len = (Py_ssize_t)(p->ev.n * width[k]);
        p->xcol[k] = (PyObject *)c;
        p->handed |= 1u << k; /* from now on the Column frees it */
    }
    PyObject *mv = PyMemoryView_FromObject(p->xcol[k]);
    if (!mv) return NULL;
    PyObject *out = PySequence_GetSlice(mv, (Py_ssize_t)(from * width[k]), (Py_ssize_t)(to * width[k]));
    Py_DECREF(mv);
    return out;
}

/* Python objects of one trace's export, released together. */
typedef struct {
    PyObject *cols[XC_N], *streams, *cc, *um, *order, *pools, *counts;
} TraceOut;

static void trace_out_free(TraceOut *o) {
    for (int k = 0; k < XC_N; k++) Py_XDECREF(o->cols[k]);
    Py_XDECREF(o->streams);
    Py_XDECREF(o->cc);
    Py_XDECREF(o->um);
    Py_XDECREF(o->order);
    Py_XDECREF(o->pools);
    Py_XDECREF(o->counts);
}

/* (event index, text) appended to a list of texts that are not the defaults; -1 on error. */
static int text_pair(P *p, PyObject *list, size_t i, int64_t off, uint32_t len) {
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p->buf + off, len, "surrogatepass");
    PyObject *pair = s ? Py_BuildValue("(nN)", (Py_ssize_t)i, s) : NULL;
    int rc = pair ? PyList_Append(list, pair) : -1;
    Py_XDECREF(pair);
    return rc;
}

/* One device's trace list -> a tuple of columns; NULL (no exception) to give up.
 * It must be an event list (C_EVLIST: the records base..base+n-1, see evlist_extend) not exported
 * before (two traces sharing records: the hand-made file goes to the reference): the columns are then finished in place (an OOM's device_free into addr, an absent
 * time to 0, frames to content classes, pool pairs to ordinals, or the pool column to 0 where the trace has
 * none) and handed over as they are. */
#define FAIL_OUT                                                                                                  \
    do {                                                                                                          \
        give_up_line = __LINE__;                                                                                  \
        goto out;                                                                                                 \
    } while (0)
static PyObject *export_trace(P *p, Cont *t) {
    size_t n = t->n;
    Events *ev = &p->ev;
    if (t->kind != C_EVLIST || n == 0) return GIVE_UP(NULL);
    size_t base = (size_t)t->ref;
    if (base < ev->exported || n > ev->n - base) return GIVE_UP(NULL);
    ev->exported = base + n;
    TraceOut o = {{NULL}, NULL, NULL, NULL, NULL, NULL, NULL};
    PyObject *out = NULL;
    int32_t *pool_rank = malloc((p->pool_n + 1) * sizeof(int32_t));
    int32_t *ord_of = malloc((ev->stream_n + 1) * sizeof(int32_t)); /* stream id -> ordinal in this trace */
    /* stack_order's run heads, each sequence once (seq_seen), in order of first appearance */
    int32_t *heads = malloc((p->seq_n + 1) * sizeof(int32_t));
    uint8_t *seq_seen = calloc(p->seq_n + 1, 1);
    /* events per sequence, in four tallies by the event's index: consecutive events of one sequence add to
     * different ones (an increment of the one before's held the next up; folded into classes after the loop) */
    const size_t ns = p->seq_n + 1;
    int64_t *tally = calloc(4 * ns, sizeof(int64_t));
    size_t nh = 0;
    int32_t prev_cls = -1; /* the class of the last event with frames */
    o.streams = PyList_New(0), o.cc = PyList_New(0), o.um = PyList_New(0), o.order = PyList_New(0);
    o.pools = PyList_New(0);
    o.counts = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(p->cls_n * sizeof(int64_t))); /* events per class */
    if (!o.streams || !o.cc || !o.um || !o.order || !o.pools || !o.counts || !pool_rank || !ord_of || !heads ||
        !seq_seen || !tally)
        FAIL_OUT;
    int64_t *counts = (int64_t *)PyBytes_AS_STRING(o.counts);
    memset(counts, 0, p->cls_n * sizeof(int64_t));
    for (size_t i = 0; i < p->pool_n; i++) pool_rank[i] = -1;
    for (size_t i = 0; i < ev->stream_n; i++) ord_of[i] = -1;
    int64_t sum_lens = 0;
    int32_t last_sid = -1, last_ord = 0, n_ords = 0, n_pools = 0;
    size_t absent_time = 0;
    const int32_t *const seq_cls = p->seq_cls;
    int any_pool = 0;
    int8_t *action = ev->action + base;
    int64_t *addr = ev->addr + base, *time = ev->time + base;
    int32_t *stream = ev->stream + base, *cls = ev->frames + base, *pool = ev->pool + base;
    const uint8_t *flags = ev->flags + base;
    for (size_t i = 0; i < n; i++) {
        if (!(flags[i] & F_FIT)) FAIL_OUT;
        if (action[i] == ACT_OOM) {
            /* the model keeps device_free there */
            int32_t si;
            if (!map_get(&ev->side_map, base + i, &si)) FAIL_OUT;
            addr[i] = ev->side[si].dfree;
        }
        /* streams: ids of non-negative values (a negative one is bad: the reference's to judge), numbered
         * here in order of first appearance in the trace */
        if (stream[i] != last_sid) {
            last_sid = stream[i];
            if (ord_of[last_sid] < 0) {
                ord_of[last_sid] = n_ords++;
                PyObject *x = PyLong_FromLongLong(ev->stream_raw[last_sid]);
                int rc = x ? PyList_Append(o.streams, x) : -1;
                Py_XDECREF(x);
                if (rc < 0) FAIL_OUT;
            }
            last_ord = ord_of[last_sid];
        }
        stream[i] = last_ord;
        if (flags[i] & F_TIME_NONE) {
            time[i] = 0;
            absent_time++;
        }
        if (cls[i] >= 0) { /* the frames list (a sequence id) becomes its content class */
            const int32_t sq = cls[i], c = seq_cls[sq];
            /* (prev_cls starts at -1: the first event with frames heads a run) */
            if (c != prev_cls && !seq_seen[sq]) seq_seen[sq] = 1, heads[nh++] = sq;
            prev_cls = c;
            tally[(i & 3) * ns + (size_t)sq]++;
            cls[i] = c;
        } else
            cls[i] = -1;
        if ((flags[i] & (F_CC_DEFAULT | F_UM_DEFAULT)) != (F_CC_DEFAULT | F_UM_DEFAULT)) {
            int32_t si;
            if (!map_get(&ev->side_map, base + i, &si)) FAIL_OUT;
            const EvSide *x = &ev->side[si];
            if (!(flags[i] & F_CC_DEFAULT) && text_pair(p, o.cc, i, x->cc_off, x->cc_len) < 0) FAIL_OUT;
            if (!(flags[i] & F_UM_DEFAULT) && text_pair(p, o.um, i, x->um_off, x->um_len) < 0) FAIL_OUT;
        }
        if (flags[i] & F_POOL) {
            int32_t pr = pool[i];
            if (!any_pool) { /* the column was left unwritten where there is no pool: now it is needed */
                any_pool = 1;
                for (size_t j = 0; j < i; j++) pool[j] = -1;
            }
            if (pool_rank[pr] < 0) {
                pool_rank[pr] = n_pools++;
                PyObject *pair = Py_BuildValue("(LL)", (long long)p->pool_a[pr], (long long)p->pool_b[pr]);
                int rc = pair ? PyList_Append(o.pools, pair) : -1;
                Py_XDECREF(pair);
                if (rc < 0) FAIL_OUT;
            }
            pool[i] = pool_rank[pr];
        } else if (any_pool)
            pool[i] = -1;
    }
    for (size_t sq = 0; sq < p->seq_n; sq++) {
        const int64_t k = tally[sq] + tally[ns + sq] + tally[2 * ns + sq] + tally[3 * ns + sq];
        counts[seq_cls[sq]] += k;
        sum_lens += k * p->seq_len[sq];
    }
    /* No pool id in the trace: the column is the model's, ordinal 0 for every event (its pages made present by the
     * prefaulter: a numpy array of zeros made for it on the Python side faulted ~2.3k fresh pages on the 460 MB
     * benchmark, on the reading thread) */
    if (!any_pool) memset(pool, 0, n * sizeof(*pool));
    /* The budget: this trace costs at least its events and frame references in the reference reader. */
    p->charged += (int64_t)n + sum_lens;
    if (p->charged > p->budget) FAIL_OUT;
    if (stack_order(p, heads, nh, o.order) < 0) FAIL_OUT;
    for (int k = 0; k < XC_N; k++)
        if (!(o.cols[k] = column_slice(p, k, base, base + n))) FAIL_OUT;
    out = Py_BuildValue("(nOOOOOnOLOOOOOOO)", (Py_ssize_t)n, o.cols[XC_ACTION], o.cols[XC_ADDR], o.cols[XC_SIZE],
                        o.cols[XC_STREAM], o.cols[XC_TIME], (Py_ssize_t)absent_time, o.cols[XC_CLS],
                        (long long)sum_lens, o.order, o.cc, o.um, o.cols[XC_POOL], o.pools,
                        o.streams, o.counts);
out:
    trace_out_free(&o);
    free(pool_rank);
    free(ord_of);
    free(heads);
    free(seq_seen);
    free(tally);
    return out;
}
#undef FAIL_OUT

/* device_traces: each trace list becomes [columns] (or [] when empty). */
static PyObject *export_traces(P *p, const Val *v) {
    if (v->kind != V_CONT || p->conts[v->x].kind != C_LIST) return export(p, v);
    Cont *dt = &p->conts[v->x];
    PyObject *o = PyList_New(dt->n);
    if (!o) return NULL;
    for (uint32_t i = 0; i < dt->n; i++) {
        Val *it = &ITEMS(p, dt)[i];
        PyObject *x;
        if (it->kind == V_CONT && p->conts[it->x].kind == C_LIST && p->conts[it->x].n == 0)
            x = PyList_New(0);
        else if (it->kind == V_CONT && (p->conts[it->x].kind == C_LIST || p->conts[it->x].kind == C_EVLIST)) {
            PyObject *cols = export_trace(p, &p->conts[it->x]); /* gives up on a list of anything but events */
            x = cols ? PyList_New(1) : NULL;
            if (x)
                PyList_SET_ITEM(x, 0, cols);
            else
                Py_XDECREF(cols);
        } else
            x = export(p, it);
        if (!x) {
            Py_DECREF(o);
            return NULL;
        }
        PyList_SET_ITEM(o, i, x);
    }
    return o;
}

static PyObject *export_root(P *p) {
    Val *root = &p->stack[0];
    if (root->kind != V_CONT || p->conts[root->x].kind != C_DICT) return export(p, root);
    Cont *c = &p->conts[root->x];
    PyObject *o = PyDict_New();
    if (!o) return NULL;
    for (uint32_t i = 0; i < c->n; i++) {
        Val *k = &ITEMS(p, c)[2 * i], *v = &ITEMS(p, c)[2 * i + 1];
        PyObject *ko = export(p, k);
        PyObject *vo = ko ? (k->key == K_DEVICE_TRACES ? export_traces(p, v) : export(p, v)) : NULL;
        if (!vo || PyDict_SetItem(o, ko, vo) < 0) {
            Py_XDECREF(ko);
            Py_XDECREF(vo);
            Py_DECREF(o);
            return NULL;
        }
        Py_DECREF(ko);
        Py_DECREF(vo);
    }
    return o;
}

/* ------------------------------------------------------------------------- */
/* gunzip                                                                      */

/* libdeflate, where the machine has its library (libdeflate.so.0): about twice zlib's inflate speed.
 * Its headers are not needed: the three functions are looked up when the module loads (dlopen), with
 * the prototypes of libdeflate.h (stable since 1.0). Without the library, zlib inflates everything. */
typedef void *(*ld_alloc_fn)(void);
typedef void (*ld_free_fn)(void *);
typedef int (*ld_gzip_fn)(void *, const void *, size_t, void *, size_t, size_t *, size_t *);
static ld_alloc_fn ld_alloc;
static ld_free_fn ld_free;
static ld_gzip_fn ld_gzip;

static void ld_load(void) {
    if (getenv("OOMSCOPE_NO_LIBDEFLATE")) return; /* zlib only (tests compare both) */
    void *h = dlopen("libdeflate.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    ld_alloc = (ld_alloc_fn)dlsym(h, "libdeflate_alloc_decompressor");
    ld_free = (ld_free_fn)dlsym(h, "libdeflate_free_decompressor");
    ld_gzip = (ld_gzip_fn)dlsym(h, "libdeflate_gzip_decompress_ex");
    if (!ld_alloc || !ld_free || !ld_gzip) ld_gzip = NULL;
}

/* The one-member file that fits the caps, by libdeflate, into a buffer of the size its trailer states
 * (libdeflate checks that size and the CRC-32). NULL for anything else: zlib's loop below then decides,
 * so every refusal, cap and second member stays zlib's. */
static unsigned char *gunzip_libdeflate(const unsigned char *in, size_t n, size_t max_out, size_t *out_n) {
    if (!ld_gzip || n < 18) return NULL;
    size_t isize = (size_t)in[n - 4] | (size_t)in[n - 3] << 8 | (size_t)in[n - 2] << 16 | (size_t)in[n - 1] << 24;
    if (isize > max_out) return NULL;
    unsigned char *out = malloc(isize ? isize : 1);
    if (!out) return NULL;
    void *d = ld_alloc();
    if (!d) {
        free(out);
        return NULL;
    }
    size_t used = 0, len = 0;
    Prefault *f = pf_whole(out, isize);
    int r = ld_gzip(d, in, n, out, isize, &used, &len);
    pf_stop(f);
    ld_free(d);
    if (r != 0 /* LIBDEFLATE_SUCCESS */ || used != n || len != isize) {
        free(out);
        return NULL;
    }
    *out_n = len;
    return out;
}

/* All gzip members, under the same caps as unpickler.gunzip; NULL to give up. */
static unsigned char *gunzip(const unsigned char *in, size_t n, size_t max_out, size_t ratio, size_t grace,
                             size_t *out_n) {
    /* Never more than the caps allow (+1 byte to see them passed): a bomb costs no more memory here. */
    size_t allowed = ratio * (n ? n : 1);
    if (allowed < grace) allowed = grace;
    if (allowed > max_out) allowed = max_out;
    max_out = allowed;
    unsigned char *fast = gunzip_libdeflate(in, n, max_out, out_n);
    if (fast) return fast;
    size_t cap = n * 4 + (1 << 16), len = 0;
    if (cap > max_out + 1) cap = max_out + 1;
    unsigned char *out = malloc(cap);
    if (!out) return NULL;
    size_t pos = 0;
    for (;;) {
        z_stream z;
        memset(&z, 0, sizeof(z));
        if (inflateInit2(&z, 31) != Z_OK) { give_up_line = __LINE__; goto fail; }
        int ret = Z_OK;
        while (ret != Z_STREAM_END) {
            if (len == cap) {
                if (cap > max_out) {
                    inflateEnd(&z);
                    { give_up_line = __LINE__; goto fail; }
                }
                size_t nc = cap * 2 > max_out + 1 ? max_out + 1 : cap * 2;
                unsigned char *q = realloc(out, nc);
                if (!q) {
                    inflateEnd(&z);
                    { give_up_line = __LINE__; goto fail; }
                }
                out = q;
                cap = nc;
            }
            size_t in_left = n - pos, out_left = cap - len;
            z.next_in = (Bytef *)(in + pos);
            z.avail_in = in_left > UINT32_MAX ? UINT32_MAX : (uInt)in_left;
            z.next_out = out + len;
            z.avail_out = out_left > UINT32_MAX ? UINT32_MAX : (uInt)out_left;
            uInt ai = z.avail_in, ao = z.avail_out;
            ret = inflate(&z, Z_NO_FLUSH);
            pos += ai - z.avail_in;
            len += ao - z.avail_out;
            if (len > max_out || (len > grace && len > ratio * (n ? n : 1))) {
                inflateEnd(&z);
                { give_up_line = __LINE__; goto fail; }
            }
            if (ret == Z_STREAM_END) break;
            if (ret != Z_OK && ret != Z_BUF_ERROR) {
                inflateEnd(&z);
                { give_up_line = __LINE__; goto fail; }
            }
            if (ret == Z_BUF_ERROR && pos == n && z.avail_out) { /* truncated */
                inflateEnd(&z);
                { give_up_line = __LINE__; goto fail; }
            }
        }
        inflateEnd(&z);
        if (pos == n) break;
        if (n - pos < 2 || in[pos] != 0x1f || in[pos + 1] != 0x8b) { give_up_line = __LINE__; goto fail; } /* trailing bytes */
        /* A second member: torch writes one. The reference reads concatenated members under its own cap on
           their count (ReadLimits.max_gzip_members); handing them over keeps that rule in one place. */
        { give_up_line = __LINE__; goto fail; }
    }
    *out_n = len;
    return out;
fail:
    free(out);
    return NULL;
}

/* ------------------------------------------------------------------------- */

static void p_free(P *p) {
    for (size_t i = 0; i < p->sl_n; i++) free(p->slots[i].items);
    free(p->slots);
    free(p->conts);
    free(p->stack);
    free(p->marks);
    free(p->memo);
    free(p->over);
    free(p->frames);
    ev_free(&p->ev, p->handed);
    for (int k = 0; k < XC_N; k++) Py_XDECREF(p->xcol[k]);
    free(p->seqpool);
    free(p->seq_off);
    free(p->seq_len);
    free(p->seq_cls);
    free(p->clspool);
    free(p->cls_off);
    free(p->cls_len);
    free(p->fv_rec);
    free(p->pool_a);
    free(p->pool_b);
    map_free(&p->seq_map);
    map_free(&p->cls_map);
    map_free(&p->fv_map);
    map_free(&p->pool_map);
    map_free(&p->span_map);
    free(p->span_at);
    free(p->span_pool);
    free(p->span_len);
    free(p->span_seq);
    free(p->span_items);
    for (size_t i = 0; i < p->cache_n; i++) Py_DECREF(p->cache[i]);
    free(p->cache);
    map_free(&p->cache_map);
}

static PyObject *py_parse(PyObject *self, PyObject *args) {
    Py_buffer view;
    int is_gzip;
    unsigned long long max_out, ratio, grace, npb, min_nodes;
    if (!PyArg_ParseTuple(args, "y*pKKKKK", &view, &is_gzip, &max_out, &ratio, &grace, &npb, &min_nodes))
        return NULL;
    P p;
    memset(&p, 0, sizeof(p));
    p.ev.last_sid = -1;
    give_up_line = 0;
    pf_made = 0;
    unsigned char *raw = NULL;
    size_t raw_n = (size_t)view.len;
    PyObject *result = NULL, *root = NULL, *fvals = NULL, *classes = NULL;
    int ok = 0;
    Py_BEGIN_ALLOW_THREADS;
    if (is_gzip) {
        raw = gunzip(view.buf, (size_t)view.len, (size_t)max_out, (size_t)ratio, (size_t)grace, &raw_n);
    }
    if (!is_gzip || raw) {
        p.buf = is_gzip ? raw : view.buf;
        p.size = raw_n;
        /* Room for what real files hold per byte (one container per ~90 bytes, a memo entry per ~60, an
         * event per ~190), so the arrays rarely move; pages never touched cost no memory. */
        size_t sz = p.size;
        if (map_init(&p.seq_map, 1024) == 0 && map_init(&p.cls_map, 1024) == 0 && map_init(&p.fv_map, 1024) == 0 &&
            map_init(&p.pool_map, 16) == 0 && map_init(&p.span_map, 1024) == 0 && grow((void **)&p.conts, &p.ccap, sz / 64 + 1024, sizeof(Cont)) == 0 &&
            (p.memo = calloc(sz / 32 + 1024, sizeof(uint32_t))) != NULL && (p.memo_cap = sz / 32 + 1024) &&
            ev_grow(&p.ev, sz / 128 + 1024) == 0 && map_init(&p.ev.side_map, 16) == 0 &&
            map_init(&p.ev.stream_map, 16) == 0 &&
            grow((void **)&p.stack, &p.scap, 4096, sizeof(Val)) == 0) {
            if (p.size >= PF_MIN_INPUT) p.pf = pf_start(&p);
            ok = run(&p) == 0;
            pf_stop(p.pf);
            p.pf = NULL;
        }
    }
    Py_END_ALLOW_THREADS;
    if (!ok) goto done;
    {
        unsigned long long b = npb * (unsigned long long)raw_n;
        p.budget = (int64_t)(b > min_nodes ? b : min_nodes);
    }
    p.fcache = calloc(p.fn + 1, sizeof(PyObject *));
    if (!p.fcache || map_init(&p.cache_map, 64) < 0) goto done;
    root = export_root(&p);
    if (!root) goto done;
    fvals = PyList_New((Py_ssize_t)p.fv_n);
    classes = PyList_New((Py_ssize_t)p.cls_n);
    if (!fvals || !classes) goto done;
    for (size_t i = 0; i < p.fv_n; i++) {
        FrameRec *f = &p.frames[p.fv_rec[i]];
        PyObject *a = str_of(&p, &f->filename), *b = line_obj(&f->line), *c = str_of(&p, &f->name);
        PyObject *t = (a && b && c) ? PyTuple_Pack(3, a, b, c) : NULL;
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(c);
        if (!t) goto done;
        PyList_SET_ITEM(fvals, i, t);
    }
    for (size_t i = 0; i < p.cls_n; i++) {
        PyObject *t = PyTuple_New(p.cls_len[i]);
        if (!t) goto done;
        for (int32_t j = 0; j < p.cls_len[i]; j++) {
            PyObject *x = PyLong_FromLong(p.clspool[p.cls_off[i] + j]);
            if (!x) {
                Py_DECREF(t);
                goto done;
            }
            PyTuple_SET_ITEM(t, j, x);
        }
        PyList_SET_ITEM(classes, i, t);
    }
    result = Py_BuildValue("(nOOO)", (Py_ssize_t)raw_n, root, fvals, classes);
done:
    if (p.fcache) {
        for (size_t i = 0; i < p.fn; i++) Py_XDECREF(p.fcache[i]);
        free(p.fcache);
    }
    Py_XDECREF(root);
    Py_XDECREF(fvals);
    Py_XDECREF(classes);
    p_free(&p);
    free(raw);
    PyBuffer_Release(&view);
    if (!result) {
        /* Giving up is never an error of ours: the reference reader decides. A MemoryError
           from Python while exporting is dropped the same way (the reference reports it). */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return result;
}

static PyObject *py_give_up_line(PyObject *self, PyObject *args) { return PyLong_FromLong(give_up_line); }

static PyObject *py_prefaulted(PyObject *self, PyObject *args) { return PyLong_FromSize_t(pf_made); }

static PyObject *py_inflater(PyObject *self, PyObject *args) { return PyUnicode_FromString(ld_gzip ? "libdeflate" : "zlib"); }

/* remap(column, table): each int32 x of the writable buffer column becomes table[x] (x < 0: -1), in place:
 * a trace's content classes into its stack ids, without numpy's copy. False (nothing changed) where a
 * value is past the table or the buffers are not int32-sized. */
static PyObject *py_remap(PyObject *self, PyObject *args) {
    Py_buffer col, tab;
    if (!PyArg_ParseTuple(args, "w*y*", &col, &tab)) return NULL;
    int ok = col.len % 4 == 0 && tab.len % 4 == 0;
    size_t n = (size_t)col.len / 4, t = (size_t)tab.len / 4;
    int32_t *c = col.buf;
    const int32_t *m = tab.buf;
    /* the largest value first (a reduction the compiler vectorizes, where a test per value with an early exit
     * was not): nothing is changed unless every value is in the table */
    int32_t top = -1;
    for (size_t i = 0; i < (ok ? n : 0); i++) top = c[i] > top ? c[i] : top;
    ok = ok && (top < 0 || (size_t)top < t);
    for (size_t i = 0; ok && i < n; i++) c[i] = c[i] < 0 ? -1 : m[c[i]];
    PyBuffer_Release(&col);
    PyBuffer_Release(&tab);
    return PyBool_FromLong(ok);
}

/* free_lanes(action, addr, stream, pool) -> () or (cur, prev): schemacheck._check_frees_match_their_blocks in
 * one pass in trace order. Each block event (alloc 0, free_requested 1, free_completed 2) is compared with
 * the block event before it at its address, kept in a map (an address per slot, open addressing); a free
 * that follows its block (it is no alloc, and the one before is no free_completed) must name the block's
 * stream and pool. Of the wrong pairs, the reference (a stable sort by address) names the one at the
 * lowest address, and there the earliest: kept as the pass goes. */
typedef struct {
    int64_t *key, *val;
    unsigned char *used;
    size_t cap, len;
} LaneMap;

static int lane_map_init(LaneMap *m, size_t cap) {
    m->cap = cap;
    m->len = 0;
    m->key = PyMem_Malloc(cap * sizeof(int64_t));
    m->val = PyMem_Malloc(cap * sizeof(int64_t));
    m->used = PyMem_Calloc(cap, 1);
    if (!m->key || !m->val || !m->used) {
        PyMem_Free(m->key);
        PyMem_Free(m->val);
        PyMem_Free(m->used);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void lane_map_free(LaneMap *m) {
    PyMem_Free(m->key);
    PyMem_Free(m->val);
    PyMem_Free(m->used);
}

static inline size_t lane_slot(const LaneMap *m, int64_t key) {
    size_t mask = m->cap - 1, j = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 17) & mask;
    while (m->used[j] && m->key[j] != key) j = (j + 1) & mask;
    return j;
}

static int lane_map_grow(LaneMap *m) {
    LaneMap old = *m;
    if (lane_map_init(m, old.cap * 2) < 0) {
        *m = old;
        return -1;
    }
    for (size_t j = 0; j < old.cap; j++)
        if (old.used[j]) {
            size_t k = lane_slot(m, old.key[j]);
            m->used[k] = 1;
            m->key[k] = old.key[j];
            m->val[k] = old.val[j];
            m->len++;
        }
    lane_map_free(&old);
    return 0;
}

static PyObject *py_free_lanes(PyObject *self, PyObject *args) {
    Py_buffer act, addr, stream, pool;
    if (!PyArg_ParseTuple(args, "y*y*y*y*", &act, &addr, &stream, &pool)) return NULL;
    PyObject *out = NULL;
    LaneMap m = {0};
    Py_ssize_t n = act.len;
    if (addr.len != n * 8 || stream.len != n * 4 || pool.len != n * 4) {
        PyErr_SetString(PyExc_ValueError, "free_lanes: columns of int8, int64, int32, int32 of one length");
        goto done;
    }
    const signed char *a = act.buf;
    const int64_t *ad = addr.buf;
    const int32_t *st = stream.buf, *pl = pool.buf;
    int64_t best_cur = -1, best_prev = -1;
    if (lane_map_init(&m, 1024) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (a[i] < 0 || a[i] > 2) continue;
        size_t j = lane_slot(&m, ad[i]);
        if (m.used[j]) {
            int64_t p = m.val[j];
            if (a[i] != 0 && a[p] != 2 && (st[i] != st[p] || pl[i] != pl[p]) &&
                (best_cur < 0 || ad[i] < ad[best_cur])) { /* an address's first wrong pair is its earliest */
                best_cur = i;
                best_prev = p;
            }
            m.val[j] = i;
            continue;
        }
        m.used[j] = 1;
        m.key[j] = ad[i];
        m.val[j] = i;
        if (++m.len * 2 > m.cap && lane_map_grow(&m) < 0) goto done;
    }
    out = best_cur < 0 ? PyTuple_New(0) : Py_BuildValue("(LL)", (long long)best_cur, (long long)best_prev);
done:
    if (m.used) lane_map_free(&m);
    PyBuffer_Release(&act);
    PyBuffer_Release(&addr);
    PyBuffer_Release(&stream);
    PyBuffer_Release(&pool);
    return out;
}

static PyMethodDef methods[] = {
    {"free_lanes", py_free_lanes, METH_VARARGS,
     "free_lanes(action, addr, stream, pool) -> () | (cur, prev): the free off its block's stream or pool"},
    {"remap", py_remap, METH_VARARGS, "remap(column, table) -> bool: int32 x -> table[x] (x < 0: -1), in place"},
    {"give_up_line", py_give_up_line, METH_NOARGS, "the C source line where the last parse gave up (0: it did not)"},
    {"prefaulted", py_prefaulted, METH_NOARGS, "bytes the last parse's helper made present ahead of it (0: none ran)"},
    {"inflater", py_inflater, METH_NOARGS, "what inflates a .gz: 'libdeflate' (where the machine has it) or 'zlib'"},
    {"parse", py_parse, METH_VARARGS,
     "parse(data, gzip, max_decompressed, max_ratio, grace, nodes_per_byte, min_nodes) -> tuple | None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_snapread",
                                    "The compiled snapshot reader (see analysis/fastread.py).", -1, methods};

PyMODINIT_FUNC PyInit__snapread(void) {
    ld_load();
    if (PyType_Ready(&ColumnType) < 0) return NULL;
    return PyModule_Create(&module);
}
