/* One JSONL line in, the ordering rules decided on its bytes: the native fast path of `toolpair normalize`.
 *
 * scan(line) -> None, or (out, reordered, in_order)
 * scan_block(block) -> (edits, answered, reordered, in_order, blank, unparsed, rest)
 *
 * scan_block does for every line of a block of whole lines (split at "\n", the
 * empty tail after a final one not a line) what the block loop of jsonl.py does:
 * a line without "_" and without a backslash is counted blank or unparsed, as
 * it is not read; any other line is scanned. It returns the moved lines as
 * (start, end, out, index), counts for every line it answered, and as `rest`
 * (start, end, index) the lines it did not answer, for the Python path.
 *
 * The line is read once, as JSON, by a strict reader: it answers only for a
 * line that orjson reads as it is written here, and whose runs are all clean
 * (as many results as calls, every ID a nonempty string, none repeated, the
 * result IDs the same set). Everything else is None, and the Python path
 * (proxy/normalize/core.py) decides the line, as it does without this module:
 *
 * - not JSON, or JSON that orjson would not read the same (a number with an
 *   exponent or more than 15 digits, a lone surrogate escape, invalid UTF-8,
 *   nesting deeper than MAX_DEPTH, a top-level value that is not an object);
 * - a key, role, type or ID written with an escape (bytes then stop being the
 *   string, so nothing is decided from them);
 * - a key repeated in one object (orjson keeps the last one);
 * - a run that is not clean (proxy.order names its reason);
 * - a line that must change but is not in orjson's own compact form
 *   (whitespace, an escape orjson writes differently, -0): only then would
 *   moving byte spans differ from orjson.dumps of the reordered record.
 *
 * When a run moves, whole result objects (their byte spans) change places and
 * every other byte stays; for a line in orjson's compact form that is exactly
 * what orjson.dumps writes for the reordered record, since each value has only
 * one way to be written there. When nothing moves, the line object itself comes
 * back. tests/test_normalize_scan.py checks this against the Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_KEYS 64     /* keys in one object */
#define MAX_ELEMS 1024  /* messages or items in the list */
#define MAX_SUBS 4096   /* tool calls and content blocks, all messages together */
#define MAX_EDITS 4096

typedef struct {
    Py_ssize_t s, e; /* [s, e) */
} Span;

enum { ROLE_OTHER = 0, ROLE_ASSISTANT, ROLE_TOOL, ROLE_USER };
enum { KIND_OTHER = 0, KIND_CALL, KIND_OUTPUT };
enum { ID_MISSING = 0, ID_STRING, ID_OTHER };

typedef struct {
    Span span;
    int is_obj, role, kind;
    int calls_array, calls_first, calls_count;     /* tool_calls, into subs */
    int content_array, blocks_first, blocks_count; /* content, into subs */
    int tcid_state, callid_state;
    Span tcid, callid;
} Elem;

typedef struct {
    Span span;
    int is_obj, kind; /* KIND_CALL: tool_use, KIND_OUTPUT: tool_result */
    int id_state, tuid_state;
    Span id, tuid;
} Sub;

typedef struct {
    Span target, source;
} Edit;

typedef struct {
    const unsigned char *p;
    Py_ssize_t n, i;
    int depth;
    int noncanonical;
    /* the list being read with facts: */
    Elem elems[MAX_ELEMS];
    int nelems;
    Sub subs[MAX_SUBS];
    int nsubs;
    Edit edits[MAX_EDITS];
    int nedits;
} Reader;

static Reader reader; /* one scan at a time: the GIL is held throughout and nothing calls back into Python */

#define DECLINE (-1)

static int skip_ws(Reader *r) {
    Py_ssize_t start = r->i;
    while (r->i < r->n) {
        unsigned char c = r->p[r->i];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n')
            r->i++;
        else
            break;
    }
    if (r->i != start)
        r->noncanonical = 1;
    return 0;
}

static unsigned char PLAIN[256]; /* filled by the module's init */

#define ONES ((uint64_t)0x0101010101010101ULL)
#define HIGHS ((uint64_t)0x8080808080808080ULL)

/* Whether all 8 bytes at p are PLAIN, tested at once (SWAR): none is the quote or the backslash
 * ((v - ONES) & ~v has a byte's high bit set exactly when some byte of v is zero, for v = x ^ the
 * byte repeated), none is below 0x20 ((x - 0x20 in every byte) & ~x, the same test for "less than"),
 * none is 0x80 or above (x's own high bits). Each test is exact as a yes/no for the whole word: a
 * borrow starts only at a byte that meets it. Read with memcpy: p need not be aligned. */
static inline int plain8(const unsigned char *p) {
    uint64_t x;
    memcpy(&x, p, sizeof x);
    uint64_t quote = x ^ (ONES * '"'), backslash = x ^ (ONES * '\\');
    uint64_t found = ((quote - ONES) & ~quote) | ((backslash - ONES) & ~backslash) | ((x - ONES * 0x20) & ~x) | x;
    return (found & HIGHS) == 0;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A string at r->i (its opening quote). Its contents' span goes to *content, and
 * *escaped says whether it holds a backslash. DECLINE for anything orjson would
 * not read as written, or that this reader does not take. */
static int read_string(Reader *r, Span *content, int *escaped) {
    const unsigned char *p = r->p;
    Py_ssize_t n = r->n, i = r->i + 1;
    int esc = 0;
    content->s = i;
    for (;;) {
        while (n - i >= 8 && plain8(p + i)) /* 8 plain bytes at a time, then byte by byte up to the first other */
            i += 8;
        while (i < n && PLAIN[p[i]]) /* printable ASCII other than the quote and the backslash */
            i++;
        if (i >= n)
            return DECLINE;
        unsigned char c = p[i];
        if (c == '"')
            break;
        if (c < 0x20)
            return DECLINE;
        if (c == '\\') {
            esc = 1;
            if (i + 1 >= n)
                return DECLINE;
            unsigned char e = p[i + 1];
            if (e == '"' || e == '\\' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                i += 2;
                continue;
            }
            if (e == '/') {
                r->noncanonical = 1;
                i += 2;
                continue;
            }
            if (e != 'u' || i + 5 >= n)
                return DECLINE;
            int v = 0;
            for (int k = 2; k < 6; k++) {
                int h = hexval(p[i + k]);
                if (h < 0)
                    return DECLINE;
                if (p[i + k] >= 'A' && p[i + k] <= 'F')
                    r->noncanonical = 1;
                v = v * 16 + h;
            }
            if (v >= 0xD800 && v <= 0xDFFF)
                return DECLINE; /* surrogates: orjson rejects a lone one; leave both kinds to Python */
            if (v >= 0x20 || v == 0x08 || v == 0x09 || v == 0x0A || v == 0x0C || v == 0x0D)
                r->noncanonical = 1; /* orjson writes these characters raw or in their short form */
            i += 6;
            continue;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        /* UTF-8: the shortest form of a scalar value, as orjson requires. */
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (p[i + 1] & 0xC0) != 0x80)
                return DECLINE;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n || (p[i + 1] & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80)
                return DECLINE;
            if (c == 0xE0 && p[i + 1] < 0xA0)
                return DECLINE;
            if (c == 0xED && p[i + 1] >= 0xA0)
                return DECLINE;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n || (p[i + 1] & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80 || (p[i + 3] & 0xC0) != 0x80)
                return DECLINE;
            if (c == 0xF0 && p[i + 1] < 0x90)
                return DECLINE;
            if (c == 0xF4 && p[i + 1] >= 0x90)
                return DECLINE;
            i += 4;
        } else {
            return DECLINE;
        }
    }
    content->e = i;
    r->i = i + 1;
    *escaped = esc;
    return 0;
}

static int read_number(Reader *r) {
    const unsigned char *p = r->p;
    Py_ssize_t n = r->n, i = r->i;
    int digits = 0, negative = 0;
    if (i < n && p[i] == '-') {
        negative = 1;
        i++;
    }
    if (i >= n)
        return DECLINE;
    if (p[i] == '0') {
        i++;
        digits = 1;
        if (i < n && p[i] >= '0' && p[i] <= '9')
            return DECLINE; /* a leading zero: not JSON */
        if (negative)
            r->noncanonical = 1; /* -0 reads as 0 */
    } else if (p[i] >= '1' && p[i] <= '9') {
        while (i < n && p[i] >= '0' && p[i] <= '9') {
            i++;
            digits++;
        }
    } else {
        return DECLINE;
    }
    if (i < n && p[i] == '.') {
        i++;
        int fraction = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9') {
            i++;
            fraction++;
        }
        if (!fraction)
            return DECLINE;
        digits += fraction;
        r->noncanonical = 1; /* orjson writes floats its own way */
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E'))
        return DECLINE;
    if (digits > 15)
        return DECLINE;
    r->i = i;
    return 0;
}

static int read_literal(Reader *r, const char *word, Py_ssize_t len) {
    if (r->n - r->i < len || memcmp(r->p + r->i, word, (size_t)len) != 0)
        return DECLINE;
    r->i += len;
    return 0;
}

static int skip_value(Reader *r);

/* Keys of one object so far, to refuse a repeated one. */
typedef struct {
    Span keys[MAX_KEYS];
    int count;
} KeySet;

static int add_key(Reader *r, KeySet *set, Span key) {
    Py_ssize_t len = key.e - key.s;
    for (int k = 0; k < set->count; k++) {
        Span other = set->keys[k];
        if (other.e - other.s == len && memcmp(r->p + other.s, r->p + key.s, (size_t)len) == 0)
            return DECLINE;
    }
    if (set->count >= MAX_KEYS)
        return DECLINE;
    set->keys[set->count++] = key;
    return 0;
}

static int key_is(Reader *r, Span key, const char *name, Py_ssize_t len) {
    return key.e - key.s == len && memcmp(r->p + key.s, name, (size_t)len) == 0;
}

/* After a key's closing quote: the colon, with the whitespace around it. */
static int read_colon(Reader *r) {
    skip_ws(r);
    if (r->i >= r->n || r->p[r->i] != ':')
        return DECLINE;
    r->i++;
    skip_ws(r);
    return 0;
}

/* An object whose keys are not looked at: each value skipped. */
static int skip_object(Reader *r) {
    KeySet set;
    set.count = 0;
    r->i++; /* { */
    skip_ws(r);
    if (r->i < r->n && r->p[r->i] == '}') {
        r->i++;
        return 0;
    }
    for (;;) {
        Span key;
        int escaped;
        if (r->i >= r->n || r->p[r->i] != '"' || read_string(r, &key, &escaped) < 0)
            return DECLINE;
        if (add_key(r, &set, key) < 0 || read_colon(r) < 0 || skip_value(r) < 0)
            return DECLINE;
        skip_ws(r);
        if (r->i >= r->n)
            return DECLINE;
        if (r->p[r->i] == ',') {
            r->i++;
            skip_ws(r);
            continue;
        }
        if (r->p[r->i] == '}') {
            r->i++;
            return 0;
        }
        return DECLINE;
    }
}

static int skip_array(Reader *r) {
    r->i++; /* [ */
    skip_ws(r);
    if (r->i < r->n && r->p[r->i] == ']') {
        r->i++;
        return 0;
    }
    for (;;) {
        if (skip_value(r) < 0)
            return DECLINE;
        skip_ws(r);
        if (r->i >= r->n)
            return DECLINE;
        if (r->p[r->i] == ',') {
            r->i++;
            skip_ws(r);
            continue;
        }
        if (r->p[r->i] == ']') {
            r->i++;
            return 0;
        }
        return DECLINE;
    }
}

static int skip_value(Reader *r) {
    if (r->i >= r->n)
        return DECLINE;
    unsigned char c = r->p[r->i];
    int result;
    switch (c) {
    case '{':
    case '[':
        if (++r->depth > MAX_DEPTH)
            return DECLINE;
        result = c == '{' ? skip_object(r) : skip_array(r);
        r->depth--;
        return result;
    case '"': {
        Span content;
        int escaped;
        return read_string(r, &content, &escaped);
    }
    case 't':
        return read_literal(r, "true", 4);
    case 'f':
        return read_literal(r, "false", 5);
    case 'n':
        return read_literal(r, "null", 4);
    default:
        return read_number(r);
    }
}

/* A value that may be a plain string: its state and span (ID_OTHER for any other value, read past). */
static int read_id(Reader *r, int *state, Span *span) {
    if (r->i < r->n && r->p[r->i] == '"') {
        int escaped;
        if (read_string(r, span, &escaped) < 0 || escaped)
            return DECLINE; /* an ID spelled with an escape: its bytes are not the string */
        *state = ID_STRING;
        return 0;
    }
    *state = ID_OTHER;
    return skip_value(r);
}

static int word_is(Reader *r, Span s, const char *word) {
    Py_ssize_t len = (Py_ssize_t)strlen(word);
    return s.e - s.s == len && memcmp(r->p + s.s, word, (size_t)len) == 0;
}

/* A string value compared with words (role, type), or another value read past. *word is
 * the matched word's index + 1, or 0. */
static int read_word(Reader *r, const char *const *words, int count, int *word) {
    *word = 0;
    if (r->i < r->n && r->p[r->i] == '"') {
        Span s;
        int escaped;
        if (read_string(r, &s, &escaped) < 0 || escaped)
            return DECLINE;
        for (int k = 0; k < count; k++)
            if (word_is(r, s, words[k])) {
                *word = k + 1;
                break;
            }
        return 0;
    }
    return skip_value(r);
}

/* The elements of an array into r->subs, each an object whose keys `first` and `second` are read as IDs
 * and `type` as a word (tool_use / tool_result). Returns the count, or DECLINE. */
static const char *const BLOCK_TYPES[] = {"tool_use", "tool_result"};

static int read_subs(Reader *r, int *first) {
    *first = r->nsubs;
    int count = 0;
    if (++r->depth > MAX_DEPTH)
        return DECLINE;
    r->i++; /* [ */
    skip_ws(r);
    if (r->i < r->n && r->p[r->i] == ']') {
        r->i++;
        r->depth--;
        return 0;
    }
    for (;;) {
        if (r->nsubs >= MAX_SUBS || r->i >= r->n)
            return DECLINE;
        Sub *sub = &r->subs[r->nsubs++];
        memset(sub, 0, sizeof *sub);
        count++;
        sub->span.s = r->i;
        if (r->p[r->i] == '{') {
            sub->is_obj = 1;
            if (++r->depth > MAX_DEPTH)
                return DECLINE;
            KeySet set;
            set.count = 0;
            r->i++;
            skip_ws(r);
            if (r->i < r->n && r->p[r->i] == '}') {
                r->i++;
            } else {
                for (;;) {
                    Span key;
                    int escaped;
                    if (r->i >= r->n || r->p[r->i] != '"' || read_string(r, &key, &escaped) < 0 || escaped)
                        return DECLINE;
                    if (add_key(r, &set, key) < 0 || read_colon(r) < 0)
                        return DECLINE;
                    int status;
                    if (key_is(r, key, "id", 2))
                        status = read_id(r, &sub->id_state, &sub->id);
                    else if (key_is(r, key, "tool_use_id", 11))
                        status = read_id(r, &sub->tuid_state, &sub->tuid);
                    else if (key_is(r, key, "type", 4)) {
                        int word;
                        status = read_word(r, BLOCK_TYPES, 2, &word);
                        sub->kind = word == 1 ? KIND_CALL : word == 2 ? KIND_OUTPUT : KIND_OTHER;
                    } else
                        status = skip_value(r);
                    if (status < 0)
                        return DECLINE;
                    skip_ws(r);
                    if (r->i >= r->n)
                        return DECLINE;
                    if (r->p[r->i] == ',') {
                        r->i++;
                        skip_ws(r);
                        continue;
                    }
                    if (r->p[r->i] == '}') {
                        r->i++;
                        break;
                    }
                    return DECLINE;
                }
            }
            r->depth--;
        } else if (skip_value(r) < 0) {
            return DECLINE;
        }
        sub->span.e = r->i;
        skip_ws(r);
        if (r->i >= r->n)
            return DECLINE;
        if (r->p[r->i] == ',') {
            r->i++;
            skip_ws(r);
            continue;
        }
        if (r->p[r->i] == ']') {
            r->i++;
            r->depth--;
            return count;
        }
        return DECLINE;
    }
}

static const char *const ROLES[] = {"assistant", "tool", "user"};
static const char *const ITEM_TYPES[] = {"function_call", "custom_tool_call", "function_call_output",
                                         "custom_tool_call_output"};

/* One message or item: an object whose role, type, IDs, tool_calls and content are read. */
static int read_elem(Reader *r, Elem *m) {
    memset(m, 0, sizeof *m);
    m->span.s = r->i;
    if (r->i >= r->n)
        return DECLINE;
    if (r->p[r->i] != '{') {
        if (skip_value(r) < 0)
            return DECLINE;
        m->span.e = r->i;
        return 0;
    }
    m->is_obj = 1;
    if (++r->depth > MAX_DEPTH)
        return DECLINE;
    KeySet set;
    set.count = 0;
    r->i++;
    skip_ws(r);
    if (r->i < r->n && r->p[r->i] == '}') {
        r->i++;
    } else {
        for (;;) {
            Span key;
            int escaped, status;
            if (r->i >= r->n || r->p[r->i] != '"' || read_string(r, &key, &escaped) < 0 || escaped)
                return DECLINE;
            if (add_key(r, &set, key) < 0 || read_colon(r) < 0)
                return DECLINE;
            if (key_is(r, key, "role", 4)) {
                int word;
                status = read_word(r, ROLES, 3, &word);
                m->role = word == 1 ? ROLE_ASSISTANT : word == 2 ? ROLE_TOOL : word == 3 ? ROLE_USER : ROLE_OTHER;
            } else if (key_is(r, key, "type", 4)) {
                int word;
                status = read_word(r, ITEM_TYPES, 4, &word);
                m->kind = word == 1 || word == 2 ? KIND_CALL : word == 3 || word == 4 ? KIND_OUTPUT : KIND_OTHER;
            } else if (key_is(r, key, "tool_calls", 10) && r->i < r->n && r->p[r->i] == '[') {
                m->calls_array = 1;
                status = m->calls_count = read_subs(r, &m->calls_first);
            } else if (key_is(r, key, "content", 7) && r->i < r->n && r->p[r->i] == '[') {
                m->content_array = 1;
                status = m->blocks_count = read_subs(r, &m->blocks_first);
            } else if (key_is(r, key, "tool_call_id", 12)) {
                status = read_id(r, &m->tcid_state, &m->tcid);
            } else if (key_is(r, key, "call_id", 7)) {
                status = read_id(r, &m->callid_state, &m->callid);
            } else {
                status = skip_value(r);
            }
            if (status < 0)
                return DECLINE;
            skip_ws(r);
            if (r->i >= r->n)
                return DECLINE;
            if (r->p[r->i] == ',') {
                r->i++;
                skip_ws(r);
                continue;
            }
            if (r->p[r->i] == '}') {
                r->i++;
                break;
            }
            return DECLINE;
        }
    }
    r->depth--;
    m->span.e = r->i;
    return 0;
}

/* The list at r->i (an array) into r->elems, from index `first`. Returns the count, or DECLINE. */
static int read_elems(Reader *r) {
    int first = r->nelems;
    if (++r->depth > MAX_DEPTH)
        return DECLINE;
    r->i++;
    skip_ws(r);
    if (r->i < r->n && r->p[r->i] == ']') {
        r->i++;
        r->depth--;
        return 0;
    }
    for (;;) {
        if (r->nelems >= MAX_ELEMS)
            return DECLINE;
        if (read_elem(r, &r->elems[r->nelems++]) < 0)
            return DECLINE;
        skip_ws(r);
        if (r->i >= r->n)
            return DECLINE;
        if (r->p[r->i] == ',') {
            r->i++;
            skip_ws(r);
            continue;
        }
        if (r->p[r->i] == ']') {
            r->i++;
            r->depth--;
            return r->nelems - first;
        }
        return DECLINE;
    }
}

static int span_eq(Reader *r, Span a, Span b) {
    return a.e - a.s == b.e - b.s && memcmp(r->p + a.s, r->p + b.s, (size_t)(a.e - a.s)) == 0;
}

/* Decide one run. calls[k], results[k]: ID spans (every one a string, checked by the caller);
 * targets[k]: the results' object spans. Returns 1 in order, 2 moved (edits added), DECLINE otherwise. */
static int decide_run(Reader *r, int k, const Span *calls, const Span *results, const Span *targets) {
    int same = 1;
    for (int a = 0; a < k; a++) {
        if (calls[a].e == calls[a].s)
            return DECLINE; /* an empty ID */
        for (int b = 0; b < a; b++)
            if (span_eq(r, calls[a], calls[b]))
                return DECLINE; /* a repeated one */
        if (!span_eq(r, calls[a], results[a]))
            same = 0;
    }
    if (same)
        return 1;
    if (r->nedits + k > MAX_EDITS)
        return DECLINE;
    /* Results must be the same set: each call matched by exactly one result (calls are unique, so a
     * result matching two calls cannot happen; k results matched to k calls is a permutation). */
    unsigned char used[256];
    if (k > 256)
        return DECLINE;
    memset(used, 0, (size_t)k);
    for (int a = 0; a < k; a++) {
        int found = -1;
        for (int b = 0; b < k; b++)
            if (!used[b] && span_eq(r, calls[a], results[b])) {
                found = b;
                break;
            }
        if (found < 0)
            return DECLINE; /* an unknown or repeated result ID */
        used[found] = 1;
        r->edits[r->nedits].target = targets[a];
        r->edits[r->nedits].source = targets[found];
        r->nedits++;
    }
    return 2;
}

#define RUN_MAX 256

/* The three rule sets over the facts; each returns DECLINE or adds to *reordered and *in_order. */
static int chat_rules(Reader *r, int first, int count, int *reordered, int *in_order) {
    Span calls[RUN_MAX], results[RUN_MAX], targets[RUN_MAX];
    int i = first, end = first + count;
    while (i < end) {
        Elem *m = &r->elems[i++];
        if (!m->is_obj || m->role != ROLE_ASSISTANT || !m->calls_array || m->calls_count == 0)
            continue;
        int start = i;
        while (i < end && r->elems[i].is_obj && r->elems[i].role == ROLE_TOOL)
            i++;
        int k = i - start;
        if (k == 0)
            continue;
        if (k != m->calls_count || k > RUN_MAX)
            return DECLINE;
        for (int a = 0; a < k; a++) {
            Sub *call = &r->subs[m->calls_first + a];
            Elem *reply = &r->elems[start + a];
            if (!call->is_obj || call->id_state != ID_STRING || reply->tcid_state != ID_STRING)
                return DECLINE;
            calls[a] = call->id;
            results[a] = reply->tcid;
            targets[a] = reply->span;
        }
        int outcome = decide_run(r, k, calls, results, targets);
        if (outcome < 0)
            return DECLINE;
        if (outcome == 1)
            (*in_order)++;
        else
            (*reordered)++;
    }
    return 0;
}

static int anthropic_rules(Reader *r, int first, int count, int *reordered, int *in_order) {
    Span calls[RUN_MAX], results[RUN_MAX], targets[RUN_MAX];
    int i = first, end = first + count;
    while (i < end) {
        Elem *m = &r->elems[i++];
        if (!m->is_obj || m->role != ROLE_ASSISTANT || !m->content_array)
            continue;
        int k = 0;
        for (int b = 0; b < m->blocks_count; b++) {
            Sub *block = &r->subs[m->blocks_first + b];
            if (block->is_obj && block->kind == KIND_CALL) {
                if (k >= RUN_MAX || block->id_state != ID_STRING)
                    return DECLINE;
                calls[k++] = block->id;
            }
        }
        if (k == 0)
            continue;
        int slots = 0;
        while (i < end && r->elems[i].is_obj && r->elems[i].role == ROLE_USER) {
            Elem *reply = &r->elems[i++];
            if (!reply->content_array)
                continue;
            for (int b = 0; b < reply->blocks_count; b++) {
                Sub *block = &r->subs[reply->blocks_first + b];
                if (block->is_obj && block->kind == KIND_OUTPUT) {
                    if (slots >= k || block->tuid_state != ID_STRING)
                        return DECLINE;
                    results[slots] = block->tuid;
                    targets[slots] = block->span;
                    slots++;
                }
            }
        }
        if (slots == 0)
            continue;
        if (slots != k)
            return DECLINE;
        int outcome = decide_run(r, k, calls, results, targets);
        if (outcome < 0)
            return DECLINE;
        if (outcome == 1)
            (*in_order)++;
        else
            (*reordered)++;
    }
    return 0;
}

static int responses_rules(Reader *r, int first, int count, int *reordered, int *in_order) {
    Span calls[RUN_MAX], results[RUN_MAX], targets[RUN_MAX];
    int i = first, end = first + count;
    while (i < end) {
        if (!r->elems[i].is_obj || r->elems[i].kind != KIND_CALL) {
            i++;
            continue;
        }
        int calls_start = i;
        while (i < end && r->elems[i].is_obj && r->elems[i].kind == KIND_CALL)
            i++;
        int run_start = i;
        while (i < end && r->elems[i].is_obj && r->elems[i].kind == KIND_OUTPUT)
            i++;
        int k = i - run_start;
        if (k == 0)
            continue;
        if (k != run_start - calls_start || k > RUN_MAX)
            return DECLINE;
        for (int a = 0; a < k; a++) {
            Elem *call = &r->elems[calls_start + a];
            Elem *output = &r->elems[run_start + a];
            if (call->callid_state != ID_STRING || output->callid_state != ID_STRING)
                return DECLINE;
            calls[a] = call->callid;
            results[a] = output->callid;
            targets[a] = output->span;
        }
        int outcome = decide_run(r, k, calls, results, targets);
        if (outcome < 0)
            return DECLINE;
        if (outcome == 1)
            (*in_order)++;
        else
            (*reordered)++;
    }
    return 0;
}

/* The record: a top-level object whose "messages" and "input" arrays are read with facts. */
static int read_record(Reader *r, int *messages_first, int *messages_count, int *input_first, int *input_count) {
    *messages_first = *input_first = -1;
    *messages_count = *input_count = 0;
    skip_ws(r);
    if (r->i >= r->n || r->p[r->i] != '{')
        return DECLINE;
    r->depth = 1;
    KeySet set;
    set.count = 0;
    r->i++;
    skip_ws(r);
    if (r->i < r->n && r->p[r->i] == '}') {
        r->i++;
    } else {
        for (;;) {
            Span key;
            int escaped, status;
            if (r->i >= r->n || r->p[r->i] != '"' || read_string(r, &key, &escaped) < 0 || escaped)
                return DECLINE;
            if (add_key(r, &set, key) < 0 || read_colon(r) < 0)
                return DECLINE;
            int is_array = r->i < r->n && r->p[r->i] == '[';
            if (is_array && key_is(r, key, "messages", 8)) {
                *messages_first = r->nelems;
                status = *messages_count = read_elems(r);
            } else if (is_array && key_is(r, key, "input", 5)) {
                *input_first = r->nelems;
                status = *input_count = read_elems(r);
            } else {
                status = skip_value(r);
            }
            if (status < 0)
                return DECLINE;
            skip_ws(r);
            if (r->i >= r->n)
                return DECLINE;
            if (r->p[r->i] == ',') {
                r->i++;
                skip_ws(r);
                continue;
            }
            if (r->p[r->i] == '}') {
                r->i++;
                break;
            }
            return DECLINE;
        }
    }
    skip_ws(r);
    return r->i == r->n ? 0 : DECLINE;
}

static int edit_order(const void *a, const void *b) {
    Py_ssize_t x = ((const Edit *)a)->target.s, y = ((const Edit *)b)->target.s;
    return (x > y) - (x < y);
}

enum { LINE_ERROR = -2, LINE_DECLINED = -1, LINE_KEPT = 0, LINE_MOVED = 1 };

/* The rules on the n bytes at p. LINE_MOVED sets *out to the new line (a new reference);
 * LINE_ERROR is a Python error (out of memory). */
static int scan_span(const unsigned char *p, Py_ssize_t n, int *reordered, int *in_order, PyObject **out) {
    Reader *r = &reader;
    r->p = p;
    r->n = n;
    r->i = 0;
    r->depth = 0;
    r->noncanonical = 0;
    r->nelems = r->nsubs = r->nedits = 0;
    *reordered = *in_order = 0;
    int messages_first, messages_count, input_first, input_count;
    if (read_record(r, &messages_first, &messages_count, &input_first, &input_count) < 0)
        return LINE_DECLINED;
    if (messages_first >= 0) {
        if (chat_rules(r, messages_first, messages_count, reordered, in_order) < 0 ||
            anthropic_rules(r, messages_first, messages_count, reordered, in_order) < 0)
            return LINE_DECLINED;
    }
    if (input_first >= 0 && responses_rules(r, input_first, input_count, reordered, in_order) < 0)
        return LINE_DECLINED;
    if (!*reordered)
        return LINE_KEPT;
    if (r->noncanonical)
        return LINE_DECLINED; /* orjson.dumps would write more than the moved spans */
    qsort(r->edits, (size_t)r->nedits, sizeof(Edit), edit_order);
    /* Moved spans change places within their runs, so the line keeps its length. */
    Py_ssize_t pos = 0, written = 0;
    for (int k = 0; k < r->nedits; k++) {
        Edit *edit = &r->edits[k];
        if (edit->target.s < pos)
            return LINE_DECLINED;
        written += edit->target.s - pos + (edit->source.e - edit->source.s);
        pos = edit->target.e;
    }
    if (written + (n - pos) != n)
        return LINE_DECLINED;
    PyObject *fresh = PyBytes_FromStringAndSize(NULL, n);
    if (fresh == NULL)
        return LINE_ERROR;
    char *dst = PyBytes_AS_STRING(fresh);
    pos = written = 0;
    for (int k = 0; k < r->nedits; k++) {
        Edit *edit = &r->edits[k];
        Py_ssize_t keep = edit->target.s - pos, len = edit->source.e - edit->source.s;
        memcpy(dst + written, p + pos, (size_t)keep);
        written += keep;
        memcpy(dst + written, p + edit->source.s, (size_t)len);
        written += len;
        pos = edit->target.e;
    }
    memcpy(dst + written, p + pos, (size_t)(n - pos));
    *out = fresh;
    return LINE_MOVED;
}

static PyObject *scan(PyObject *Py_UNUSED(module), PyObject *line) {
    if (!PyBytes_Check(line)) {
        PyErr_SetString(PyExc_TypeError, "scan() takes bytes");
        return NULL;
    }
    int reordered, in_order;
    PyObject *fresh = NULL;
    int status = scan_span((const unsigned char *)PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line), &reordered,
                           &in_order, &fresh);
    if (status == LINE_ERROR)
        return NULL;
    if (status == LINE_DECLINED)
        Py_RETURN_NONE;
    if (status == LINE_KEPT)
        return Py_BuildValue("(Oii)", line, reordered, in_order);
    return Py_BuildValue("(Nii)", fresh, reordered, in_order);
}

/* Whether bytes.isspace() would say so: empty is not, ASCII whitespace only is. */
static int all_space(const unsigned char *p, Py_ssize_t n) {
    if (n == 0)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != 0x0b && c != 0x0c)
            return 0;
    }
    return 1;
}

static int append_tuple(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int status = PyList_Append(list, item);
    Py_DECREF(item);
    return status;
}

static PyObject *scan_block(PyObject *Py_UNUSED(module), PyObject *block) {
    if (!PyBytes_Check(block)) {
        PyErr_SetString(PyExc_TypeError, "scan_block() takes bytes");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(block);
    Py_ssize_t n = PyBytes_GET_SIZE(block), pos = 0, index = 0;
    long answered = 0, reordered = 0, in_order = 0, blank = 0, unparsed = 0;
    PyObject *edits = PyList_New(0), *rest = PyList_New(0);
    if (edits == NULL || rest == NULL)
        goto fail;
    while (pos < n) {
        const unsigned char *newline = memchr(p + pos, '\n', (size_t)(n - pos));
        Py_ssize_t end = newline ? newline - p : n, len = end - pos;
        const unsigned char *line = p + pos;
        if (memchr(line, '_', (size_t)len) || memchr(line, '\\', (size_t)len)) {
            int moved, kept;
            PyObject *fresh = NULL;
            int status = scan_span(line, len, &moved, &kept, &fresh);
            if (status == LINE_ERROR)
                goto fail;
            if (status == LINE_DECLINED) {
                if (append_tuple(rest, Py_BuildValue("(nnn)", pos, end, index)) < 0)
                    goto fail;
            } else {
                answered++;
                reordered += moved;
                in_order += kept;
                if (status == LINE_MOVED && append_tuple(edits, Py_BuildValue("(nnNn)", pos, end, fresh, index)) < 0)
                    goto fail;
            }
        } else if (all_space(line, len) || len == 0) {
            blank++;
        } else {
            unparsed++;
        }
        pos = end + 1;
        index++;
    }
    return Py_BuildValue("(NlllllN)", edits, answered, reordered, in_order, blank, unparsed, rest);
fail:
    Py_XDECREF(edits);
    Py_XDECREF(rest);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(line) -> None or (out, reordered, in_order): the ordering rules on one JSONL line's bytes."},
    {"scan_block", scan_block, METH_O,
     "scan_block(block) -> (edits, answered, reordered, in_order, blank, unparsed, rest): every line of a block."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) {
    for (int c = 0x20; c < 0x80; c++)
        PLAIN[c] = c != '"' && c != '\\';
    return PyModule_Create(&module);
}
