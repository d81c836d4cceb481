#!/usr/bin/env python3
"""Computes the fixed test vectors of proto/src/content.rs and proto/src/snapshot.rs apart from
the Rust code: a pure-Python BLAKE3 written from its specification (checked below against
published vectors), SHA-256 from hashlib, and the protobuf encodings written by hand.

Run: python3 proto/testdata/content_vectors.py"""
import hashlib

IV = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19]
PERM = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8]
CHUNK_START, CHUNK_END, PARENT, ROOT, KEYED_HASH, DERIVE_KEY_CONTEXT, DERIVE_KEY_MATERIAL = 1, 2, 4, 8, 16, 32, 64
M = 0xFFFFFFFF
def rotr(x, n): return ((x >> n) | (x << (32 - n))) & M
def g(s, a, b, c, d, x, y):
    s[a] = (s[a] + s[b] + x) & M; s[d] = rotr(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & M; s[b] = rotr(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b] + y) & M; s[d] = rotr(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & M; s[b] = rotr(s[b] ^ s[c], 7)
def rnd(s, m):
    g(s,0,4,8,12,m[0],m[1]); g(s,1,5,9,13,m[2],m[3]); g(s,2,6,10,14,m[4],m[5]); g(s,3,7,11,15,m[6],m[7])
    g(s,0,5,10,15,m[8],m[9]); g(s,1,6,11,12,m[10],m[11]); g(s,2,7,8,13,m[12],m[13]); g(s,3,4,9,14,m[14],m[15])
def compress(cv, block_words, counter, block_len, flags):
    s = list(cv) + IV[:4] + [counter & M, (counter >> 32) & M, block_len, flags]
    m = list(block_words)
    for r in range(7):
        rnd(s, m)
        if r < 6: m = [m[p] for p in PERM]
    for i in range(8):
        s[i] ^= s[i + 8]; s[i + 8] ^= cv[i]
    return s
def words(b):
    b = b + bytes(64 - len(b))
    return [int.from_bytes(b[i:i+4], 'little') for i in range(0, 64, 4)]
class Output:
    def __init__(self, cv, bw, counter, bl, flags): self.cv, self.bw, self.counter, self.bl, self.flags = cv, bw, counter, bl, flags
    def chaining_value(self): return compress(self.cv, self.bw, self.counter, self.bl, self.flags)[:8]
    def root_bytes(self, n):
        out = b''; c = 0
        while len(out) < n:
            w = compress(self.cv, self.bw, c, self.bl, self.flags | ROOT)
            out += b''.join(x.to_bytes(4, 'little') for x in w); c += 1
        return out[:n]
def chunk_output(key, chunk, counter, flags):
    cv = list(key); blocks = [chunk[i:i+64] for i in range(0, len(chunk), 64)] or [b'']
    for i, blk in enumerate(blocks):
        f = flags | (CHUNK_START if i == 0 else 0)
        if i == len(blocks) - 1:
            return Output(cv, words(blk), counter, len(blk), f | CHUNK_END)
        cv = compress(cv, words(blk), counter, 64, f)[:8]
def parent_output(l, r, key, flags): return Output(key, l + r, 0, 64, flags | PARENT)
def hash_output(key, data, flags):
    chunks = [data[i:i+1024] for i in range(0, len(data), 1024)] or [b'']
    stack = []  # chaining values, merged like a binary counter
    for i, ch in enumerate(chunks):
        out = chunk_output(key, ch, i, flags)
        if i == len(chunks) - 1:
            # merge the rest right to left
            while stack:
                out = parent_output(stack.pop(), out.chaining_value(), key, flags)
            return out
        cv = out.chaining_value(); total = i + 1
        while total & 1 == 0:
            cv = parent_output(stack.pop(), cv, key, flags).chaining_value(); total >>= 1
        stack.append(cv)
def blake3(data, n=32): return hash_output(IV, data, 0).root_bytes(n)
def derive_key(context, material, n=32):
    ck = hash_output(IV, context.encode(), DERIVE_KEY_CONTEXT).root_bytes(32)
    key = [int.from_bytes(ck[i:i+4], 'little') for i in range(0, 32, 4)]
    return hash_output(key, material, DERIVE_KEY_MATERIAL).root_bytes(n)

# The BLAKE3 specification's vectors: the hash of no input, and derive_key of no input under
# its test-vector context.
assert blake3(b"").hex() == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
assert derive_key("BLAKE3 2019-12-27 16:29:52 test vectors context", b"").hex() == (
    "2cc39783c223154fea8dfb7c1b1660f2ac2dcbd1c1de8277b0b0dd39b7e50d7d")

CTX = "holdfast 2026-12-03 snapshot content element v1"
def element(rh):
    b = derive_key(CTX, rh, 2048)
    return [int.from_bytes(b[i:i+2], 'little') for i in range(0, 2048, 2)]
def content_hash(rhs):
    lanes = [0]*1024
    for rh in rhs:
        e = element(rh)
        lanes = [(a+b) & 0xffff for a, b in zip(lanes, e)]
    return hashlib.sha256(b''.join(l.to_bytes(2,'little') for l in lanes)).hexdigest()
def h(n): return bytes([n])*32
e7 = element(h(7))
print("element(h7) lanes 0,1,1023:", e7[0], e7[1], e7[1023])
print("of([h7])", content_hash([h(7)]))
print("default", content_hash([]))
print("of([h1,h2])", content_hash([h(1), h(2)]))
# protobuf by hand
def varint(n):
    out=b''
    while True:
        b=n&0x7f; n>>=7
        if n: out+=bytes([b|0x80])
        else: return out+bytes([b])
def ld(field, payload): return varint(field<<3|2)+varint(len(payload))+payload
def vi(field, n): return varint(field<<3|0)+varint(n)
route = vi(1,2) + ld(2,b"/api") + ld(3,b"default/web:80")
vh = ld(1,b"a.example.com") + ld(2, route)
be = ld(1,b"default/web:80")
print("vh", vh.hex()); print("be", be.hex())
rvh = hashlib.sha256(bytes([1])+vh).digest(); rbe = hashlib.sha256(bytes([2])+be).digest()
print("rvh", rvh.hex()); print("rbe", rbe.hex())
print("sample content hash", content_hash([rvh, rbe]))
