/* The backfill's hot path for the common index: one int column, placed by its value.
 *
 * int_rows(rows, name, n_shards, payload, groups) does, for a batch of entity rows
 * (added_id, id, version, body), what cleaner/batch.py's derive() does one entity at a
 * time in Python: read the property ``name`` out of each body's msgpack map (without
 * building the entity), place the value with the shard placement of
 * schemaless/hashing.py (BLAKE2b-64 of index.key_encode(value), big-endian, modulo
 * n_shards) and append (value, id, version) to groups[shard].
 *
 * It accepts only what is certainly clean: a raw or (through ``payload``) decompressed
 * msgpack map, every byte of it well formed as Codec.decode would read it (strict
 * UTF-8, str map keys, known extensions in range, no trailing bytes), and a value that
 * is absent, nil or an int in the signed 64-bit range.  Anything else -- a corrupt
 * body, another type, an exception from ``payload`` -- is not judged here: the row's
 * position is returned, and the Python path decides (it raises, sets aside, or
 * recovers exactly as before).  So the two paths agree by construction on what this
 * accepts, and tests/test_cleaner_rows.py checks it against the Python path.
 *
 * int_text(rows, shard) renders a group of those rows as the upsert's VALUES text, each
 * row led by ``shard`` unless it is None (the owned layout's rows carry their logical
 * shard), as cleaner/sql.py's rows_text does for them in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* -- BLAKE2b (RFC 7693), unkeyed, 8-byte digest ---------------------------------- */

static const uint64_t IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
    0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
    0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

static const uint8_t SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

#define ROTR64(x, n) (((x) >> (n)) | ((x) << (64 - (n))))
#define G(a, b, c, d, x, y)             \
    do {                                \
        v[a] = v[a] + v[b] + (x);       \
        v[d] = ROTR64(v[d] ^ v[a], 32); \
        v[c] = v[c] + v[d];             \
        v[b] = ROTR64(v[b] ^ v[c], 24); \
        v[a] = v[a] + v[b] + (y);       \
        v[d] = ROTR64(v[d] ^ v[a], 16); \
        v[c] = v[c] + v[d];             \
        v[b] = ROTR64(v[b] ^ v[c], 63); \
    } while (0)

static uint64_t load64(const uint8_t *p) {
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

static void compress(uint64_t h[8], const uint8_t block[128], uint64_t t, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++) m[i] = load64(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= t; /* inputs here are far below 2**64 bytes: the high word stays 0 */
    if (last) v[14] = ~v[14];
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = SIGMA[r];
        G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/* The digest's 8 bytes read big-endian, as hashing.shard_of reads them. */
static uint64_t blake2b64(const uint8_t *data, size_t len) {
    uint64_t h[8];
    uint8_t block[128];
    memcpy(h, IV, sizeof h);
    h[0] ^= 0x01010000ULL ^ 8; /* fanout 1, depth 1, no key, 8-byte digest */
    uint64_t t = 0;
    while (len > 128) {
        t += 128;
        compress(h, data, t, 0);
        data += 128;
        len -= 128;
    }
    memset(block, 0, sizeof block);
    memcpy(block, data, len);
    compress(h, block, t + len, 1);
    uint64_t out = 0;
    for (int i = 0; i < 8; i++) out = (out << 8) | ((h[0] >> (8 * i)) & 0xff);
    return out;
}

/* The logical shard of an int value: BLAKE2b-64 of index.key_encode(value) (TAG_INT,
 * then value + 2**63 as 8 bytes big-endian), modulo n_shards. */
static uint64_t place(int64_t value, uint64_t n_shards) {
    uint8_t key[9];
    uint64_t biased = (uint64_t)value ^ 0x8000000000000000ULL;
    key[0] = 0x02;
    for (int i = 0; i < 8; i++) key[1 + i] = (uint8_t)(biased >> (56 - 8 * i));
    return blake2b64(key, sizeof key) % n_shards;
}

/* -- msgpack, as Codec.decode reads it: well formed, or not clean ------------------- */

#define MAX_DEPTH 64 /* deeper than any entity encode() writes (32): left to Python */
#define DT_MIN (-62135596800000000LL) /* 0001-01-01 - 1970-01-01, in microseconds */
#define DT_MAX (253402300799999999LL) /* 9999-12-31 23:59:59.999999 */

typedef struct {
    const uint8_t *p, *end;
} Cur;

static int take(Cur *c, size_t n, const uint8_t **out) {
    if ((size_t)(c->end - c->p) < n) return -1;
    *out = c->p;
    c->p += n;
    return 0;
}

static int be(Cur *c, size_t n, uint64_t *out) {
    const uint8_t *q;
    if (take(c, n, &q)) return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) x = (x << 8) | q[i];
    *out = x;
    return 0;
}

/* Strict UTF-8 as Python decodes it: no overlong forms, surrogates or > U+10FFFF. */
static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint8_t lo = 0x80, hi = 0xbf;
        if (b >= 0xc2 && b <= 0xdf) k = 1;
        else if (b >= 0xe0 && b <= 0xef) {
            k = 2;
            if (b == 0xe0) lo = 0xa0;
            if (b == 0xed) hi = 0x9f;
        } else if (b >= 0xf0 && b <= 0xf4) {
            k = 3;
            if (b == 0xf0) lo = 0x90;
            if (b == 0xf4) hi = 0x8f;
        } else return 0;
        if (n - i <= k) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

/* A str of n bytes: its bytes in *out. */
static int str_body(Cur *c, size_t n, const uint8_t **out) {
    if (take(c, n, out)) return -1;
    return utf8_ok(*out, n) ? 0 : -1;
}

/* The extensions of codec._ext_hook, in the range it accepts. */
static int ext_ok(int8_t code, const uint8_t *d, size_t n) {
    if (code == 1) return n == 16 ? 0 : -1;
    if (code != 2 || n != 12) return -1;
    int64_t micros = 0;
    int32_t seconds = 0;
    uint64_t um = 0;
    uint32_t us = 0;
    for (int i = 0; i < 8; i++) um = (um << 8) | d[i];
    for (int i = 8; i < 12; i++) us = (us << 8) | d[i];
    memcpy(&micros, &um, 8);
    memcpy(&seconds, &us, 4);
    if (seconds <= -86400 || seconds >= 86400) return -1; /* timezone()'s bound */
    int64_t local;
    if (__builtin_add_overflow(micros, (int64_t)seconds * 1000000, &local)) return -1;
    return (local >= DT_MIN && local <= DT_MAX) ? 0 : -1;
}

/* A map key at c, a str (a key of another type is left to Python): its bytes in *k,
 * *len; a value must follow it. */
static int read_key(Cur *c, const uint8_t **k, size_t *len) {
    uint64_t n;
    if (c->p >= c->end) return -1;
    uint8_t b = *c->p++;
    if (b >= 0xa0 && b <= 0xbf) n = b & 0x1f;
    else if (b == 0xd9 || b == 0xda || b == 0xdb) {
        if (be(c, (size_t)1 << (b - 0xd9), &n)) return -1;
    } else return -1;
    if (n > (uint64_t)(c->end - c->p) || str_body(c, (size_t)n, k)) return -1;
    *len = (size_t)n;
    return c->p < c->end ? 0 : -1; /* a value follows */
}

static int skip(Cur *c, int depth);

static int skip_items(Cur *c, uint64_t n, int depth, int map) {
    if (depth > MAX_DEPTH) return -1;
    if (n > (uint64_t)(c->end - c->p)) return -1; /* each item takes a byte at least */
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *k;
        size_t len;
        if (map && read_key(c, &k, &len)) return -1;
        if (skip(c, depth + 1)) return -1;
    }
    return 0;
}

static int skip_ext(Cur *c, size_t n) {
    const uint8_t *q;
    if (take(c, 1, &q)) return -1;
    int8_t code = (int8_t)q[0];
    if (take(c, n, &q)) return -1;
    return ext_ok(code, q, n);
}

static int skip(Cur *c, int depth) {
    uint64_t n;
    const uint8_t *q;
    if (c->p >= c->end) return -1;
    uint8_t b = *c->p++;
    if (b <= 0x7f || b >= 0xe0) return 0;                      /* fixint */
    if (b <= 0x8f) return skip_items(c, b & 0x0f, depth, 1);   /* fixmap */
    if (b <= 0x9f) return skip_items(c, b & 0x0f, depth, 0);   /* fixarray */
    if (b <= 0xbf) return str_body(c, b & 0x1f, &q);           /* fixstr */
    switch (b) {
    case 0xc0: case 0xc2: case 0xc3: return 0;                 /* nil, bool */
    case 0xc4: case 0xc5: case 0xc6:                           /* bin */
        if (be(c, (size_t)1 << (b - 0xc4), &n) || n > (uint64_t)(c->end - c->p)) return -1;
        return take(c, (size_t)n, &q);
    case 0xc7: case 0xc8: case 0xc9:                           /* ext */
        if (be(c, (size_t)1 << (b - 0xc7), &n) || n > (uint64_t)(c->end - c->p)) return -1;
        return skip_ext(c, (size_t)n);
    case 0xca: return take(c, 4, &q);                          /* float 32 */
    case 0xcb: return take(c, 8, &q);                          /* float 64 */
    case 0xcc: case 0xcd: case 0xce: case 0xcf:                /* uint */
        return take(c, (size_t)1 << (b - 0xcc), &q);
    case 0xd0: case 0xd1: case 0xd2: case 0xd3:                /* int */
        return take(c, (size_t)1 << (b - 0xd0), &q);
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:     /* fixext */
        return skip_ext(c, (size_t)1 << (b - 0xd4));
    case 0xd9: case 0xda: case 0xdb:                           /* str */
        if (be(c, (size_t)1 << (b - 0xd9), &n) || n > (uint64_t)(c->end - c->p)) return -1;
        return str_body(c, (size_t)n, &q);
    case 0xdc: case 0xdd:                                      /* array */
        if (be(c, (size_t)2 << (b - 0xdc), &n)) return -1;
        return skip_items(c, n, depth, 0);
    case 0xde: case 0xdf:                                      /* map */
        if (be(c, (size_t)2 << (b - 0xde), &n)) return -1;
        return skip_items(c, n, depth, 1);
    default: return -1;                                        /* 0xc1: never used */
    }
}

enum { NONE, INT, OTHER };

/* The value at c: nil (NONE), an int in the signed 64-bit range (INT, in *out), or
 * anything else (OTHER: for Python to coerce or refuse).  c moves past it. */
static int read_int(Cur *c, int64_t *out) {
    const uint8_t *start = c->p;
    uint8_t b = *c->p;
    uint64_t u;
    if (b <= 0x7f) {
        *out = b;
        c->p++;
        return INT;
    }
    if (b >= 0xe0) {
        *out = (int8_t)b;
        c->p++;
        return INT;
    }
    if (b == 0xc0) {
        c->p++;
        return NONE;
    }
    if (b >= 0xcc && b <= 0xd3) {
        size_t n = (size_t)1 << ((b - 0xcc) & 3);
        c->p++;
        if (be(c, n, &u)) return -1;
        if (b <= 0xcf) {
            if (u > (uint64_t)INT64_MAX) return OTHER;
            *out = (int64_t)u;
        } else {
            int shift = 64 - 8 * (int)n; /* sign-extend */
            *out = (int64_t)(u << shift) >> shift;
        }
        return INT;
    }
    c->p = start;
    return skip(c, 1) ? -1 : OTHER;
}

/* The property `name` of one msgpack map payload: NONE, INT (*out) or OTHER;
 * -1 when the payload is not clean. */
static int property(const uint8_t *p, size_t len, const char *name, size_t name_len,
                    int64_t *out) {
    Cur c = {p, p + len};
    uint64_t n;
    const uint8_t *k;
    if (len == 0) return -1;
    uint8_t b = *c.p++;
    if (b >= 0x80 && b <= 0x8f) n = b & 0x0f;
    else if (b == 0xde || b == 0xdf) {
        if (be(&c, (size_t)2 << (b - 0xde), &n)) return -1;
    } else return -1; /* not a map */
    if (n > (uint64_t)(c.end - c.p)) return -1;
    int found = NONE;
    for (uint64_t i = 0; i < n; i++) {
        size_t klen;
        if (read_key(&c, &k, &klen)) return -1;
        if (klen == name_len && memcmp(k, name, name_len) == 0) {
            found = read_int(&c, out); /* a later duplicate key wins, as in a dict */
            if (found < 0) return -1;
        } else if (skip(&c, 1)) return -1;
    }
    return c.p == c.end ? found : -1;
}

/* -- the batch ------------------------------------------------------------------- */

/* The bytes holding one body's payload (a new reference) from *skip on, or NULL with
 * no error set when it is not for this path (the Python path reads it). */
static PyObject *payload_of(PyObject *body, PyObject *payload, size_t *skip) {
    if (!PyBytes_CheckExact(body)) return NULL;
    const char *s = PyBytes_AS_STRING(body);
    Py_ssize_t n = PyBytes_GET_SIZE(body);
    *skip = 0;
    if (n >= 2 && s[0] == 1 && s[1] == 0) { /* raw (codec._HEAD_RAW): read in place */
        *skip = 2;
        Py_INCREF(body);
        return body;
    }
    PyObject *out = PyObject_CallOneArg(payload, body);
    if (out == NULL || !PyBytes_CheckExact(out)) {
        PyErr_Clear(); /* the Python path meets the error again and reports it */
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

/* One row into its group: 1 done, 0 not for this path, -1 on a Python error. */
static int one_row(PyObject *row, const char *name, size_t name_len, uint64_t n_shards,
                   PyObject *payload, PyObject *groups) {
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 4) return 0;
    PyObject *body = PyTuple_GET_ITEM(row, 3);
    if (body == Py_None) return 1; /* a tombstone: no rows */
    size_t skip_head;
    PyObject *data = payload_of(body, payload, &skip_head);
    if (data == NULL) return 0;
    const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(data);
    size_t len = (size_t)PyBytes_GET_SIZE(data);
    int64_t value;
    int kind = property(p + skip_head, len - skip_head, name, name_len, &value);
    Py_DECREF(data);
    if (kind == NONE) return 1;
    if (kind != INT) return 0;
    uint64_t shard = place(value, n_shards);
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    PyObject *out = PyTuple_Pack(3, v, PyTuple_GET_ITEM(row, 1), PyTuple_GET_ITEM(row, 2));
    Py_DECREF(v);
    if (out == NULL) return -1;
    int err = PyList_Append(PyList_GET_ITEM(groups, (Py_ssize_t)shard), out);
    Py_DECREF(out);
    return err ? -1 : 1;
}

static PyObject *int_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *rows, *payload, *groups;
    const char *name;
    Py_ssize_t name_len;
    unsigned long long n_shards;
    if (!PyArg_ParseTuple(args, "O!s#KOO!:int_rows", &PyList_Type, &rows, &name, &name_len,
                          &n_shards, &payload, &PyList_Type, &groups))
        return NULL;
    if (n_shards == 0 || (unsigned long long)PyList_GET_SIZE(groups) != n_shards) {
        PyErr_SetString(PyExc_ValueError, "groups must hold one list per shard");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(groups); i++) {
        if (!PyList_CheckExact(PyList_GET_ITEM(groups, i))) {
            PyErr_SetString(PyExc_TypeError, "groups must be lists");
            return NULL;
        }
    }
    PyObject *rest = PyList_New(0);
    if (rest == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        Py_INCREF(row); /* payload() may run Python code */
        int done = one_row(row, name, (size_t)name_len, n_shards, payload, groups);
        Py_DECREF(row);
        if (done < 0) {
            Py_DECREF(rest);
            return NULL;
        }
        if (done == 0) {
            PyObject *pos = PyLong_FromSsize_t(i);
            if (pos == NULL || PyList_Append(rest, pos)) {
                Py_XDECREF(pos);
                Py_DECREF(rest);
                return NULL;
            }
            Py_DECREF(pos);
        }
    }
    return rest;
}

static PyObject *place_int(PyObject *self, PyObject *args) {
    (void)self;
    long long value;
    unsigned long long n_shards;
    if (!PyArg_ParseTuple(args, "LK:place_int", &value, &n_shards)) return NULL;
    if (n_shards == 0) {
        PyErr_SetString(PyExc_ValueError, "n_shards must be positive");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(place(value, n_shards));
}

static PyObject *digest64(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:digest64", &data)) return NULL;
    uint64_t out = blake2b64((const uint8_t *)data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(out);
}

/* -- the upserts' text ------------------------------------------------------------ */

static char *decimal(char *w, unsigned long long u, int negative) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (negative) *w++ = '-';
    while (n) *w++ = tmp[--n];
    return w;
}

/* One row (value, id, version) as text, after ``lead`` (the shard and a comma, or
 * nothing), or NULL with an error set. */
static char *row_text(char *w, PyObject *row, const char *lead, size_t lead_len) {
    static const char hex[] = "0123456789abcdef";
    /* exact types only: no __index__ (Python code) can run and change the rows
     * between the two passes of int_text */
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 3 ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(row, 0)) ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(row, 1)) ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(row, 2))) {
        PyErr_SetString(PyExc_TypeError, "rows must be (int, bytes, int) tuples");
        return NULL;
    }
    long long value = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 0));
    if (value == -1 && PyErr_Occurred()) return NULL;
    unsigned long long version = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(row, 2));
    if (version == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    PyObject *key = PyTuple_GET_ITEM(row, 1);
    const uint8_t *k = (const uint8_t *)PyBytes_AS_STRING(key);
    Py_ssize_t n = PyBytes_GET_SIZE(key);
    *w++ = '(';
    memcpy(w, lead, lead_len);
    w += lead_len;
    w = decimal(w, value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value,
                value < 0);
    memcpy(w, ",X'", 3);
    w += 3;
    for (Py_ssize_t i = 0; i < n; i++) {
        *w++ = hex[k[i] >> 4];
        *w++ = hex[k[i] & 15];
    }
    memcpy(w, "',", 2);
    w += 2;
    w = decimal(w, version, 0);
    memcpy(w, "),", 2);
    return w + 2;
}

static PyObject *int_text(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *rows, *shard = Py_None;
    if (!PyArg_ParseTuple(args, "O|O:int_text", &rows, &shard)) return NULL;
    if (!PyList_Check(rows)) {
        PyErr_SetString(PyExc_TypeError, "rows must be a list");
        return NULL;
    }
    char lead[24];
    size_t lead_len = 0;
    if (shard != Py_None) {
        /* an exact int in SMALLINT UNSIGNED's range, the column that holds it */
        long s = PyLong_CheckExact(shard) ? PyLong_AsLong(shard) : -1;
        if (s == -1 && PyErr_Occurred()) return NULL;
        if (s < 0 || s > 65535) {
            PyErr_SetString(PyExc_ValueError, "shard must be None or an int in 0..65535");
            return NULL;
        }
        lead_len = (size_t)(decimal(lead, (unsigned long long)s, 0) - lead);
        lead[lead_len++] = ',';
    }
    Py_ssize_t n = PyList_GET_SIZE(rows);
    size_t cap = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        cap += 48 + lead_len; /* parentheses, commas, quotes, two 20-digit numbers, a sign */
        if (PyTuple_CheckExact(row) && PyTuple_GET_SIZE(row) == 3 &&
            PyBytes_CheckExact(PyTuple_GET_ITEM(row, 1)))
            cap += 2 * (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(row, 1));
    }
    char *buf = PyMem_Malloc(cap);
    if (buf == NULL) return PyErr_NoMemory();
    char *w = buf;
    for (Py_ssize_t i = 0; i < n && w != NULL; i++)
        w = row_text(w, PyList_GET_ITEM(rows, i), lead, lead_len);
    PyObject *out = w == NULL ? NULL : PyUnicode_DecodeASCII(buf, n ? w - buf - 1 : 0, NULL);
    PyMem_Free(buf);
    return out;
}

static PyMethodDef methods[] = {
    {"int_rows", int_rows, METH_VARARGS,
     "int_rows(rows, name, n_shards, payload, groups) -> positions left to Python"},
    {"int_text", int_text, METH_VARARGS,
     "int_text(rows, shard=None) -> the SQL text of (int, bytes, int) rows:"
     " (1,X'0a',7),(2,X'0b',7), or led by the shard: (3,1,X'0a',7),(3,2,X'0b',7)"},
    {"place_int", place_int, METH_VARARGS, "place_int(value, n_shards) -> logical shard"},
    {"digest64", digest64, METH_VARARGS,
     "digest64(data) -> BLAKE2b-64 of data, its bytes read big-endian"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows",
                                    "The backfill's hot path for one-int-column indexes.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
