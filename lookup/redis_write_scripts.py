"""The Lua scripts of :class:`~lookup.RedisWrite` (many fenced writes per call, each atomic) and
the version keys they keep.

Two forms share one body. :data:`SCRIPT` takes each write's key and version key as ``KEYS``
(one node, and a Redis Cluster's per-slot calls: Redis refuses declared keys of two slots).
:data:`SCRIPT_PER_MASTER` takes them in ``ARGV`` and declares none, so one call carries writes
of every slot one master serves: Redis (6.x and on; from 7.0 a script without a ``#!lua``
line keeps this) lets such a script touch any key its node serves, checking each command as it
runs. A key its node does not serve (a slot moved, or migrating and the key already gone) makes
that write's commands fail before they run, with an error
:func:`~lookup.redis_nodes.not_served_here` recognises: that write did nothing, and is sent
again the per-slot way, which follows redirects.
"""

from __future__ import annotations

import functools
import hashlib

from redis.crc import key_slot

__all__ = ["CHUNK", "SCRIPT", "SCRIPT_PER_MASTER", "SHA", "SHA_PER_MASTER", "version_key"]

VERSION_SUFFIX = ":kaw-version"

# Many writes per call (a Lua call costs more than the commands in it: 3.5 us against 0.15 us
# for a SET, by Redis's commandstats). Per write its key and its version key: in KEYS (SCRIPT),
# or the first two of its ARGV (SCRIPT_PER_MASTER). Then in ARGV per write its version ('' =
# unfenced), command, ttl ms ('0' = none), tombstone ttl ms, the count of values, then the
# value (SET), or (HSET) the count of field and value items, those items, and the fields a
# NULL removes; before them all (ARGV[1]) the token of this call's batch (one per attempt: a
# retry makes a new batch). A version key holds ``version|token``: the same version found with
# this token is this very call sent again (redis-py's resend after a lost answer), applied.
# Answers, per write: 1 applied, 0 stale (an older version), 2 the same version already held,
# or the error of that write alone (the others still run, in order).
_FUNCTIONS = """
local token = ARGV[1]
local function split(held)
  if not held then return nil, nil end
  local bar = string.find(held, '|', 1, true)
  if not bar then return held, '' end
  return string.sub(held, 1, bar - 1), string.sub(held, bar + 1)
end
local function newer(new, held)
  if not held then return true end
  local n = math.min(#new, #held)
  for i = 1, n do
    local a, b = string.byte(new, i), string.byte(held, i)
    if a ~= b then return a > b end
  end
  return #new > #held
end
local function write(key, vkey, version, command, ttl, tomb, first, last)
  if version ~= '' then
    local held = redis.pcall('GET', vkey)
    if type(held) == 'table' and held.err then return held end
    local held_version, held_token = split(held)
    if version == held_version then
      if held_token == token then return 1 end
      return 2
    end
    if not newer(version, held_version) then return 0 end
  end
  local done
  if command == 'DEL' then
    done = redis.pcall('DEL', key)
    ttl = tomb
  elseif command == 'SET' then  -- SET replaces the value and any TTL the key had
    if ttl ~= '0' then done = redis.pcall('SET', key, ARGV[first], 'PX', ttl)
    else done = redis.pcall('SET', key, ARGV[first]) end
  else  -- HSET: the fields with a value set, those with NULL removed (never the text "null")
    local n = tonumber(ARGV[first])
    done = 0
    if n > 0 then done = redis.pcall('HSET', key, unpack(ARGV, first + 1, first + n)) end
    if not (type(done) == 'table' and done.err) and last > first + n then
      done = redis.pcall('HDEL', key, unpack(ARGV, first + n + 1, last))
    end
    if not (type(done) == 'table' and done.err) then
      if ttl ~= '0' then redis.pcall('PEXPIRE', key, ttl) else redis.pcall('PERSIST', key) end
    end
  end
  if type(done) == 'table' and done.err then return done end
  if version ~= '' then
    local kept = version .. '|' .. token
    if ttl ~= '0' then redis.call('SET', vkey, kept, 'PX', ttl) else redis.call('SET', vkey, kept) end
  end
  return 1
end
"""

SCRIPT = (
    _FUNCTIONS
    + """
local out, a = {}, 2
for w = 1, #KEYS / 2 do
  local count = tonumber(ARGV[a + 4])
  local first = a + 5
  out[w] = write(KEYS[2 * w - 1], KEYS[2 * w], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
                 first, first + count - 1)
  a = first + count
end
return out
"""
)

SCRIPT_PER_MASTER = (
    _FUNCTIONS
    + """
local out, a, w = {}, 2, 0
while a <= #ARGV do
  w = w + 1
  local count = tonumber(ARGV[a + 6])
  local first = a + 7
  out[w] = write(ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
                 first, first + count - 1)
  a = first + count
end
return out
"""
)

CHUNK = 100  # writes per script call: its Lua overhead shared, Redis still not blocked for long
SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()  # what EVALSHA names each script by
SHA_PER_MASTER = hashlib.sha1(SCRIPT_PER_MASTER.encode()).hexdigest()


def version_key(key: str, cluster: bool) -> str:
    """Where the version of ``key``'s last applied write is kept: ``key:kaw-version``. On a
    Redis Cluster it must hash to ``key``'s slot: a key with a hash tag (``{...}``) keeps it in
    the suffixed name; a key without one is wrapped in braces, ``{key}:kaw-version``, whose tag
    is the whole key, so the user adds no hash tag. A key holding a ``}`` but no tag cannot be
    wrapped; its version key gets a tag that hashes to the key's slot."""
    if not cluster or _has_hash_tag(key):
        return key + VERSION_SUFFIX
    if "}" not in key:
        return "{" + key + "}" + VERSION_SUFFIX
    return "{" + _tag_of_slot(key_slot(key.encode())) + "}" + key + VERSION_SUFFIX


@functools.lru_cache(maxsize=1024)
def _tag_of_slot(slot: int) -> str:
    """The smallest decimal number whose hash is ``slot`` (a few thousand CRC16s, once per slot)."""
    for n in range(1_000_000):  # every slot is reached well before: CRC16 spreads decimals evenly
        if key_slot(str(n).encode()) == slot:
            return str(n)
    raise AssertionError(f"no tag for cluster slot {slot}")


def _has_hash_tag(key: str) -> bool:
    """Whether Redis Cluster hashes ``key`` by a tag: a ``{`` with a ``}`` after it, something between."""
    start = key.find("{")
    return start >= 0 and key.find("}", start + 1) > start + 1
