/* The record loops of rocketray.wire.batch and rocketray.broker.batch in C: seal a producer's
 * batch, index received or stored records (broker/batch.py), encode a new record, read a sealed
 * batch's offsets, find the last whole record (wire/batch.py).  Same checks, same bytes, same error
 * messages as the pure-Python loops of those two modules, which stay the reference:
 * tests/broker/test_records_c.py drives both with the same valid, damaged and adversarial inputs
 * and requires equal results.
 *
 * What stays in Python (called back a few times per batch, not per record): the topic check
 * (``topic_of(raw, where) -> str``), the properties check and tag hash (``tag_of(raw) -> int``) of
 * properties that are not plainly valid without a tag (see props_plain: the usual client record,
 * whose properties are only its UNIQ_KEY, never calls back) and, when sealing, the next queue
 * offset of a queue seen for the first time in the batch.
 * Both callbacks raise the codec error class passed in; when indexing without ``verify`` such an
 * error ends the scan like any invalid record does.
 *
 * scan(buf, base_offset, mode, max_size, now_ms, next_queue_offsets, topic_of, tag_of, error_class)
 *   mode 0 SEAL: buf is the batch's writable copy, base_offset its physical offset.
 *   mode 1 VERIFY / mode 2 TRUSTED: index records stored at base_offset.
 * returns (end_pos, count, runs, error): runs = [[topic, queue_id, first_queue_offset, entries, count]]
 * in creation order, entries a bytearray of CQ entries (>qIQ: physical, size, tag).
 *
 * The CRC-32 is ISA-L's crc32_gzip_refl when built against libisal (the same function as
 * zlib's crc32, ~5x faster on 1 KiB), else zlib's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifdef RR_HAVE_ISAL
#include <isa-l/crc.h>
static inline uint32_t rr_crc(uint32_t crc, const unsigned char *p, size_t n) { return crc32_gzip_refl(crc, p, n); }
#define RR_CRC_NAME "isal"
#else
#include <zlib.h>
static inline uint32_t rr_crc(uint32_t crc, const unsigned char *p, size_t n) {
    while (n > 0x40000000u) { crc = (uint32_t)crc32(crc, p, 0x40000000u); p += 0x40000000u; n -= 0x40000000u; }
    return (uint32_t)crc32(crc, p, (uInt)n);
}
#define RR_CRC_NAME "zlib"
#endif

#define HEADER_SIZE 66
#define MAGIC 0x52524D31u
#define MAX_TOPIC_BYTES 127
#define MAX_RECORD_SIZE (64 * 1024 * 1024)
#define CQ_SIZE 20

enum { MODE_SEAL = 0, MODE_VERIFY = 1, MODE_TRUSTED = 2 };

static inline uint32_t get_u32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline uint16_t get_u16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline int64_t get_i64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return (int64_t)v;
}
static inline void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}
static inline void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) { p[i] = (unsigned char)v; v >>= 8; }
}

typedef struct {
    Py_ssize_t topic_at;   /* offset in buf of the topic bytes of the run's first record */
    int topic_len;
    int32_t queue_id;
    int64_t first_queue_offset;
    Py_ssize_t count;
    PyObject *topic;       /* str, owned */
    unsigned char *entries;
    Py_ssize_t cap;
} Run;

typedef struct {
    Run *runs;
    Py_ssize_t n, cap;
    Py_ssize_t *slots;     /* open addressing: run index + 1, 0 = empty */
    Py_ssize_t nslots, used;
} Runs;

static void runs_free(Runs *r) {
    for (Py_ssize_t i = 0; i < r->n; i++) {
        Py_XDECREF(r->runs[i].topic);
        PyMem_Free(r->runs[i].entries);
    }
    PyMem_Free(r->runs);
    PyMem_Free(r->slots);
}

static uint64_t key_hash(int32_t queue_id, const unsigned char *topic, int topic_len) {
    uint64_t h = 1469598103934665603ull ^ (uint32_t)queue_id;
    h *= 1099511628211ull;
    for (int i = 0; i < topic_len; i++) { h ^= topic[i]; h *= 1099511628211ull; }
    return h ^ (h >> 29);
}

/* The slot holding the run of this key, or the empty slot where it would go. With by_topic == 0 the
 * key is the queue id alone (index modes: the last run of that queue id). */
static Py_ssize_t *find_slot(Runs *r, const unsigned char *buf, int32_t queue_id, const unsigned char *topic,
                             int topic_len, int by_topic) {
    uint64_t h = key_hash(queue_id, by_topic ? topic : NULL, by_topic ? topic_len : 0);
    Py_ssize_t mask = r->nslots - 1;
    for (Py_ssize_t i = (Py_ssize_t)(h & (uint64_t)mask);; i = (i + 1) & mask) {
        Py_ssize_t s = r->slots[i];
        if (s == 0) return &r->slots[i];
        Run *run = &r->runs[s - 1];
        if (run->queue_id == queue_id &&
            (!by_topic || (run->topic_len == topic_len && memcmp(buf + run->topic_at, topic, (size_t)topic_len) == 0)))
            return &r->slots[i];
    }
}

static int grow_slots(Runs *r, const unsigned char *buf, int by_topic) {
    Py_ssize_t old_n = r->nslots;
    Py_ssize_t *old = r->slots;
    Py_ssize_t n = old_n ? old_n * 2 : 16;
    r->slots = PyMem_Calloc((size_t)n, sizeof(Py_ssize_t));
    if (!r->slots) { r->slots = old; PyErr_NoMemory(); return -1; }
    r->nslots = n;
    for (Py_ssize_t i = 0; i < old_n; i++) {
        if (old[i]) {
            Run *run = &r->runs[old[i] - 1];
            *find_slot(r, buf, run->queue_id, buf + run->topic_at, run->topic_len, by_topic) = old[i];
        }
    }
    PyMem_Free(old);
    return 0;
}

static Run *new_run(Runs *r) {
    if (r->n == r->cap) {
        Py_ssize_t cap = r->cap ? r->cap * 2 : 8;
        Run *runs = PyMem_Realloc(r->runs, (size_t)cap * sizeof(Run));
        if (!runs) { PyErr_NoMemory(); return NULL; }
        r->runs = runs;
        r->cap = cap;
    }
    Run *run = &r->runs[r->n++];
    memset(run, 0, sizeof(Run));
    return run;
}

static int add_entry(Run *run, int64_t physical, uint32_t size, uint64_t tag) {
    if ((run->count + 1) * CQ_SIZE > run->cap) {
        Py_ssize_t cap = run->cap ? run->cap * 2 : 32 * CQ_SIZE;
        unsigned char *e = PyMem_Realloc(run->entries, (size_t)cap);
        if (!e) { PyErr_NoMemory(); return -1; }
        run->entries = e;
        run->cap = cap;
    }
    unsigned char *p = run->entries + run->count * CQ_SIZE;
    put_u64(p, (uint64_t)physical);
    put_u32(p + 8, size);
    put_u64(p + 12, tag);
    run->count++;
    return 0;
}

/* Properties that batch.properties_tag_hash would accept with tag hash 0, decided without calling it:
 * ASCII only (so valid UTF-8), the separators alternate 0x01 0x02 starting after a non-empty name
 * and ending with the last byte (properties_tag_hash's separator, first-byte, last-byte and empty-name
 * checks), and no "TAGS\x01" anywhere (a TAGS name, whose hash Python computes). Anything else,
 * valid or not, goes to properties_tag_hash, which decides and raises as before: a client's
 * UNIQ_KEY makes every record's properties differ, so this runs once per record. */
static int props_plain(const unsigned char *p, Py_ssize_t n) {
    int in_value = 0;
    Py_ssize_t name_len = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c >= 0x80) return 0;
        if (c == 1) {
            if (in_value || name_len == 0) return 0;
            if (name_len >= 4 && memcmp(p + i - 4, "TAGS", 4) == 0) return 0;
            in_value = 1;
        } else if (c == 2) {
            if (!in_value) return 0;
            in_value = 0;
            name_len = 0;
        } else if (!in_value) {
            name_len++;
        }
    }
    return n > 0 && !in_value && name_len == 0;
}

/* Raise error_class(message) built with PyUnicode_FromFormatV. Always returns -1. */
static int codec_error(PyObject *error_class, const char *fmt, ...) {
    va_list vargs;
    va_start(vargs, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, vargs);
    va_end(vargs);
    if (msg) {
        PyErr_SetObject(error_class, msg);
        Py_DECREF(msg);
    }
    return -1;
}

static PyObject *build_runs(Runs *r) {
    PyObject *out = PyList_New(r->n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < r->n; i++) {
        Run *run = &r->runs[i];
        PyObject *entries = PyByteArray_FromStringAndSize((const char *)run->entries, run->count * CQ_SIZE);
        if (!entries) { Py_DECREF(out); return NULL; }
        PyObject *item = Py_BuildValue("[OiLNn]", run->topic, (int)run->queue_id, (long long)run->first_queue_offset,
                                       entries, run->count);
        if (!item) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long base_offset, now_ms;
    int mode;
    Py_ssize_t max_size;
    PyObject *next_queue_offsets, *topic_of, *tag_of, *error_class;
    if (!PyArg_ParseTuple(args, "y*LinLOOOO", &view, &base_offset, &mode, &max_size, &now_ms,
                          &next_queue_offsets, &topic_of, &tag_of, &error_class))
        return NULL;
    if (mode == MODE_SEAL && view.readonly) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "sealing needs a writable buffer");
        return NULL;
    }
    unsigned char *buf = (unsigned char *)view.buf;
    const Py_ssize_t n = view.len;
    const int seal = mode == MODE_SEAL, verify = mode == MODE_VERIFY;
    Runs runs = {0};
    PyObject *error = NULL;          /* TRUSTED: why the scan stopped early (str) */
    PyObject *result = NULL;
    Py_ssize_t pos = 0, count = 0;
    const unsigned char *last_props = NULL;
    Py_ssize_t last_props_len = -1;
    uint64_t last_tag = 0;
    uint32_t head_size = 0, head_crc = 0;  /* CRC of (size, magic) is cached for the last size seen */
    int have_head = 0;
    if (grow_slots(&runs, buf, seal) < 0) goto done;

    for (;;) {
        if (seal ? pos >= n : n - pos < HEADER_SIZE) break;
        const unsigned char *h = buf + pos;
        long long at = base_offset + pos;
        if (seal && n - pos < HEADER_SIZE) {
            codec_error(error_class, "batch: %zd trailing bytes at %zd are not a record", n - pos, pos);
            goto fail;
        }
        uint32_t total = get_u32(h), magic = get_u32(h + 4), hcrc = get_u32(h + 8), body_crc = get_u32(h + 12);
        int32_t queue_id = (int32_t)get_u32(h + 20);
        int64_t queue_offset = get_i64(h + 24), physical = get_i64(h + 32);
        uint32_t topic_len = get_u16(h + 56), props_len = get_u32(h + 58), body_len = get_u32(h + 62);
        uint64_t sum = (uint64_t)HEADER_SIZE + topic_len + props_len + body_len;
        Py_ssize_t end = pos + (Py_ssize_t)total;
        if (seal) {
            if (magic != MAGIC || total != sum || (uint64_t)total > (uint64_t)(n - pos) || topic_len < 1 ||
                topic_len > MAX_TOPIC_BYTES) {
                codec_error(error_class, "batch: malformed record header at %zd (total %u, magic 0x%x)", pos,
                            total, magic);
                goto fail;
            }
            if ((Py_ssize_t)total > max_size) {
                codec_error(error_class, "batch: record of %u bytes at %zd exceeds the limit %zd", total, pos, max_size);
                goto fail;
            }
            if (rr_crc(0, buf + end - body_len, body_len) != body_crc) {
                codec_error(error_class, "batch: body CRC mismatch in the record at %zd", pos);
                goto fail;
            }
        } else {
            if (magic != MAGIC || total != sum || topic_len < 1 || topic_len > MAX_TOPIC_BYTES ||
                total > MAX_RECORD_SIZE) {
                codec_error(error_class, "malformed record header at %lld", at);
                goto fail;
            }
            if ((uint64_t)total > (uint64_t)(n - pos)) {
                if (verify) {
                    codec_error(error_class, "record at %lld needs %u bytes, have %zd", at, total, n - pos);
                    goto fail;
                }
                break;
            }
        }
        Py_ssize_t body_start = end - (Py_ssize_t)body_len;
        Py_ssize_t topic_start = pos + HEADER_SIZE;
        Py_ssize_t props_start = topic_start + topic_len;
        if (!have_head || head_size != total) {
            head_crc = rr_crc(0, h, 8);
            head_size = total;
            have_head = 1;
        }
        if (verify) {
            if (rr_crc(head_crc, h + 12, (size_t)(body_start - pos - 12)) != hcrc) {
                codec_error(error_class, "header CRC mismatch at %lld", at);
                goto fail;
            }
            if (rr_crc(0, buf + body_start, body_len) != body_crc) {
                codec_error(error_class, "body CRC mismatch at %lld", at);
                goto fail;
            }
            if (physical != at) {
                codec_error(error_class, "record at %lld claims physical offset %lld", at, (long long)physical);
                goto fail;
            }
            if ((Py_ssize_t)total > max_size) {
                codec_error(error_class, "record of %u bytes exceeds the limit %zd", total, max_size);
                goto fail;
            }
        }
        /* the run of this record */
        Py_ssize_t *slot = find_slot(&runs, buf, queue_id, buf + topic_start, (int)topic_len, seal);
        Run *run = *slot ? &runs.runs[*slot - 1] : NULL;
        if (run && !seal) {
            if (!(run->topic_len == (int)topic_len &&
                  memcmp(buf + run->topic_at, buf + topic_start, topic_len) == 0 &&
                  run->first_queue_offset + run->count == queue_offset))
                run = NULL;
        }
        if (!run) {
            PyObject *topic = NULL;
            if (runs.n) {  /* a topic already checked in this scan (the last run's, usually) is not checked again */
                Run *last = &runs.runs[runs.n - 1];
                if (last->topic_len == (int)topic_len && memcmp(buf + last->topic_at, buf + topic_start, topic_len) == 0) {
                    topic = last->topic;
                    Py_INCREF(topic);
                }
            }
            if (!topic) {
                PyObject *raw = PyBytes_FromStringAndSize((const char *)buf + topic_start, topic_len);
                if (!raw) goto fail;
                topic = PyObject_CallFunction(topic_of, "OL", raw, seal ? (long long)pos : at);
                Py_DECREF(raw);
                if (!topic) goto fail;
            }
            int64_t first = queue_offset;
            if (seal) {
                PyObject *key = Py_BuildValue("(Oi)", topic, (int)queue_id);
                PyObject *got = key ? PyObject_CallMethod(next_queue_offsets, "get", "Oi", key, 0) : NULL;
                Py_XDECREF(key);
                if (!got) { Py_DECREF(topic); goto fail; }
                first = PyLong_AsLongLong(got);
                Py_DECREF(got);
                if (first == -1 && PyErr_Occurred()) { Py_DECREF(topic); goto fail; }
            }
            Py_ssize_t had = *slot;  /* index modes: the queue id's slot will name its newest run */
            run = new_run(&runs);
            if (!run) { Py_DECREF(topic); goto fail; }
            run->topic_at = topic_start;
            run->topic_len = (int)topic_len;
            run->queue_id = queue_id;
            run->first_queue_offset = first;
            run->topic = topic;
            *slot = runs.n;  /* new_run moved the runs, never the slots */
            if (!had && ++runs.used * 2 > runs.nslots && grow_slots(&runs, buf, seal) < 0) goto fail;
        }
        uint64_t tag = 0;
        if (props_len) {
            if ((Py_ssize_t)props_len != last_props_len ||
                memcmp(last_props, buf + props_start, props_len) != 0) {
                if (props_plain(buf + props_start, (Py_ssize_t)props_len)) {
                    last_tag = 0;
                } else {
                    PyObject *raw = PyBytes_FromStringAndSize((const char *)buf + props_start, props_len);
                    if (!raw) goto fail;
                    PyObject *got = PyObject_CallOneArg(tag_of, raw);
                    Py_DECREF(raw);
                    if (!got) goto fail;
                    last_tag = PyLong_AsUnsignedLongLong(got);
                    Py_DECREF(got);
                    if (PyErr_Occurred()) goto fail;
                }
                last_props = buf + props_start;
                last_props_len = props_len;
            }
            tag = last_tag;
        }
        if (seal) {
            int64_t qo = run->first_queue_offset + run->count;
            put_u64(buf + pos + 24, (uint64_t)qo);
            put_u64(buf + pos + 32, (uint64_t)at);
            put_u64(buf + pos + 48, (uint64_t)now_ms);
            put_u32(buf + pos + 8, rr_crc(head_crc, h + 12, (size_t)(body_start - pos - 12)));
        }
        if (add_entry(run, at, total, tag) < 0) goto fail;
        pos = end;
        count++;
        continue;
    fail:
        if (mode == MODE_TRUSTED && PyErr_ExceptionMatches(error_class)) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            error = value ? PyObject_Str(value) : NULL;
            Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
            if (!error) goto done;
            break;
        }
        goto done;
    }
    if (verify && pos != n) {
        codec_error(error_class, "%zd trailing bytes at %lld are not a record", n - pos, base_offset + pos);
        goto done;
    }
    {
        PyObject *list = build_runs(&runs);
        if (list) result = Py_BuildValue("nnNO", pos, count, list, error ? error : Py_None);
    }
done:
    Py_XDECREF(error);
    runs_free(&runs);
    PyBuffer_Release(&view);
    return result;
}

/* offsets(buf): ((queue_offset, physical_offset), ...) of the trusted records in buf (a sealed batch). */
static PyObject *offsets(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t n = view.len, pos = 0, count = 0;
    while (n - pos >= HEADER_SIZE) {
        uint32_t total = get_u32(buf + pos);
        if (total < HEADER_SIZE) break;
        pos += total;
        count++;
    }
    PyObject *out = PyTuple_New(count);
    pos = 0;
    for (Py_ssize_t i = 0; out && i < count; i++) {
        PyObject *pair = Py_BuildValue("(LL)", (long long)get_i64(buf + pos + 24), (long long)get_i64(buf + pos + 32));
        if (!pair) { Py_CLEAR(out); break; }
        PyTuple_SET_ITEM(out, i, pair);
        pos += get_u32(buf + pos);
    }
    PyBuffer_Release(&view);
    return out;
}

/* whole_length(buf, max_bytes): message.whole_records_length. */
static PyObject *whole_length(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTuple(args, "y*n", &view, &max_bytes)) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t n = view.len, end = 0;
    while (end + HEADER_SIZE <= n) {
        Py_ssize_t size = (Py_ssize_t)get_u32(buf + end);
        if (size < HEADER_SIZE || size > n - end || (end > 0 && end + size > max_bytes)) break;
        end += size;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(end);
}

/* encode(topic, props, body, queue_id, born_ms): message.encode_fields(topic, props, body, queue_id, born_ms),
 * the record of a new message (flags 0, queue and physical offset -1, store timestamp 0), the same
 * bytes; None when an argument is not what that fast case takes (not exact bytes, a number out of
 * its field's range, a record over MAX_RECORD_SIZE): the caller then runs encode_fields, which
 * raises its own error. A producer encodes every message here once. */
static PyObject *encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[1]) || !PyBytes_CheckExact(args[2]) ||
        !PyLong_CheckExact(args[3]) || !PyLong_CheckExact(args[4]))
        Py_RETURN_NONE;
    int overflow = 0;
    long long queue_id = PyLong_AsLongLongAndOverflow(args[3], &overflow);
    if (overflow || (queue_id == -1 && PyErr_Occurred()) || queue_id < INT32_MIN || queue_id > INT32_MAX) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    long long born = PyLong_AsLongLongAndOverflow(args[4], &overflow);
    if (overflow || (born == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t topic_len = PyBytes_GET_SIZE(args[0]), props_len = PyBytes_GET_SIZE(args[1]),
               body_len = PyBytes_GET_SIZE(args[2]);
    Py_ssize_t total = HEADER_SIZE + topic_len + props_len + body_len;
    if (topic_len > 0xFFFF || total > MAX_RECORD_SIZE) Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(args[2]);
    put_u32(p, (uint32_t)total);
    put_u32(p + 4, MAGIC);
    put_u32(p + 12, rr_crc(0, body, (size_t)body_len));
    put_u32(p + 16, 0);                                  /* flags */
    put_u32(p + 20, (uint32_t)(int32_t)queue_id);
    put_u64(p + 24, (uint64_t)(int64_t)-1);              /* queue offset */
    put_u64(p + 32, (uint64_t)(int64_t)-1);              /* physical offset */
    put_u64(p + 40, (uint64_t)born);
    put_u64(p + 48, 0);                                  /* store timestamp */
    p[56] = (unsigned char)(topic_len >> 8);
    p[57] = (unsigned char)topic_len;
    put_u32(p + 58, (uint32_t)props_len);
    put_u32(p + 62, (uint32_t)body_len);
    memcpy(p + HEADER_SIZE, PyBytes_AS_STRING(args[0]), (size_t)topic_len);
    memcpy(p + HEADER_SIZE + topic_len, PyBytes_AS_STRING(args[1]), (size_t)props_len);
    memcpy(p + HEADER_SIZE + topic_len + props_len, body, (size_t)body_len);
    put_u32(p + 8, rr_crc(rr_crc(0, p, 8), p + 12, (size_t)(HEADER_SIZE - 12 + topic_len + props_len)));
    return out;
}

static PyMethodDef methods[] = {
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL, "A new message's record (message.encode_fields), or None."},
    {"whole_length", whole_length, METH_VARARGS, "Length of the whole records in buf within max_bytes (at least one)."},
    {"scan", scan, METH_VARARGS, "Seal a batch or index records (see the module source)."},
    {"offsets", offsets, METH_O, "((queue_offset, physical_offset), ...) of the records of a sealed batch."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", "The record loops of wire/batch.py and broker/batch.py, in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__records(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddStringConstant(m, "CRC32", RR_CRC_NAME) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
