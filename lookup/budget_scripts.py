"""The Lua scripts of a job-wide budget (:mod:`lookup.budget`), run atomically by Redis on its
own clock. Every key of one budget carries the hash tag ``{name}``, so a Redis Cluster keeps
them in one slot.

Keys: ``S`` the budget's state (a hash), ``L`` the leases in flight (a sorted set: lease id ->
expiry), ``G`` the groups sharing it (a sorted set: group -> activity expiry). State fields:
``tk``/``tl`` the calls bucket (tokens, last refill), ``ut``/``ul`` the units bucket, per group
``w:<g>`` its weight, ``n:<g>`` its leases, ``want:<g>`` when it was last refused, ``gt:<g>``/
``gl:<g>`` its share of the calls bucket; ``paused`` (a ``Retry-After``); ``s_remaining``/
``s_reset``/``s_rate``/``s_rate_until`` and ``u_remaining``/``u_reset``/``u_rate``/
``u_rate_until`` what the service said of its calls and units; ``aimd``, ``base``, ``cut``,
``slow`` the adaptive limit; ``uc`` units given back (a credit the cap does not cut) and
``uratio`` what calls used over what they were estimated to cost (learned from settlements);
``ra_*`` and ``p_*`` a quota learned from ``Retry-After`` alone and its probing, and
``trial_end``/``trial_at`` the one call let through to find where a window ends.

Invariants: leases held never exceed the concurrency limit in force when each was taken; a
lease whose holder stopped renewing it (a killed task) is gone ``lease`` seconds after its last
renewal, and its place with it; calls started over any ``T`` seconds stay within ``burst +
rate * T`` (the rate less the headroom; a pause earns no tokens, so the calls it held back
start within it too); cost units used over any ``T`` stay within
``units_burst + units_rate * T`` plus what was charged and not yet settled, and a unit
given back is never lost to the bucket's cap (it is a credit the next charges spend first);
a group's leases count stays the number of its live
leases (each lease id carries its group).
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "PAUSED", "RELEASE", "RENEW"]

_COMMON = """
local S, L, G = KEYS[1], KEYS[2], KEYS[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function num(f, d)
  local v = redis.call('HGET', S, f)
  if v then return tonumber(v) end
  return d
end
local function expire_dead()
  local dead = redis.call('ZRANGEBYSCORE', L, '-inf', now)
  for _, id in ipairs(dead) do
    redis.call('HINCRBY', S, 'n:' .. string.match(id, '^(.-)|'), -1)
  end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', L, '-inf', now) end
end
local function keep()
  redis.call('PEXPIRE', S, 3600000)
  redis.call('PEXPIRE', L, 3600000)
  redis.call('PEXPIRE', G, 3600000)
end
"""

ACQUIRE = (
    _COMMON
    + """
local group, weight, lease, lease_s = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local rate, burst = tonumber(ARGV[5]), tonumber(ARGV[6])
local urate, uburst = tonumber(ARGV[7]), tonumber(ARGV[8])
local cap, cost = tonumber(ARGV[9]), tonumber(ARGV[10])
local adaptive, ceiling, headroom = ARGV[11] == '1', tonumber(ARGV[12]), tonumber(ARGV[13])
local follow = ARGV[14] == '1'
expire_dead()
redis.call('ZADD', G, now + 10 + lease_s, group)
redis.call('HSET', S, 'w:' .. group, weight)
local gone = redis.call('ZRANGEBYSCORE', G, '-inf', now)
for _, g in ipairs(gone) do
  redis.call('HDEL', S, 'w:' .. g, 'n:' .. g, 'want:' .. g, 'gt:' .. g, 'gl:' .. g)
end
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', G, '-inf', now) end
keep()
local function refuse(wait, why)
  redis.call('HSET', S, 'want:' .. group, now)
  return {1, tostring(wait), why}
end
local paused = num('paused', 0)
if paused > now then return refuse(paused - now, 'the service asked to wait (Retry-After)') end
local limit, source = cap, 'configured'
if adaptive then
  local a = math.max(1, math.floor(num('aimd', math.min(ceiling, 4))))
  if limit <= 0 or a < limit then limit, source = a, 'adaptive' end
end
if num('trial_end', 0) > now then
  limit, source = 1, 'one call to find where the window ends'
end
-- while the service has said nothing of its quota and no rate is configured, calls start at
-- a pace that doubles every half second from 40 a second (a cold start), so that the first 429s
-- (or answers stating the quota) come before a burst of calls in flight can overrun it; after
-- a 429, two calls in flight at most until the quota is learned
local quiet = follow and rate <= 0 and num('heard', 0) <= now and num('s_rate_until', 0) <= now
local cold = 0
if quiet then
  local began = num('c0', 0)
  if began == 0 then
    began = now
    redis.call('HSET', S, 'c0', now)
  end
  cold = 40 * 2 ^ math.min(20, math.max(0, 2 * (now - began)))
  if cold > 5000 then cold = 0 end
  local ss_cap = num('ss_cap', 0)
  if ss_cap > 0 and (limit <= 0 or ss_cap < limit) then limit, source = ss_cap, 'quota not known yet' end
end
local others, total = false, 0
for _, g in ipairs(redis.call('ZRANGE', G, 0, -1)) do
  total = total + num('w:' .. g, 1)
  if g ~= group and num('want:' .. g, 0) > now - 1 then others = true end
end
local share = weight / math.max(total, weight)
if limit > 0 then
  if redis.call('ZCARD', L) >= limit then return refuse(0, 'in flight ' .. source) end
  if others and num('n:' .. group, 0) >= math.max(1, math.floor(limit * share)) then
    return refuse(0, 'fair share of in flight')
  end
end
local sreset, sremain = num('s_reset', 0), num('s_remaining', -1)
if sreset > now and sremain >= 0 and sremain < 1 then
  return refuse(sreset - now, 'the service said no calls are left')
end
local ureset, uremain = num('u_reset', 0), num('u_remaining', -1)
if ureset > now and uremain >= 0 and uremain < math.min(cost, 1) then
  return refuse(ureset - now, 'the service said no units are left')
end
local function rate_of(field, until_field, given)
  local said = num(field, 0)
  if said > 0 and num(until_field, 0) > now then return said * (1 - headroom) end
  return given * (1 - headroom)
end
local function take(tf, lf, r, b, n)
  -- a reservation: the tokens are taken now, and the caller starts once the bucket has
  -- earned them back (its debt is the queue: each waits for the reservations before it)
  local tokens = math.min(b, num(tf, b) + math.max(0, now - num(lf, now)) * r) - n
  redis.call('HSET', S, tf, tokens, lf, now)
  if tokens >= 0 then return 0 end
  return -tokens / r
end
local wait = 0
local r = rate_of('s_rate', 's_rate_until', rate)
if r <= 0 then r = cold end
if r > 0 then
  local rb = burst > 0 and burst or 1
  wait = take('tk', 'tl', r, rb, 1)
  if others then
    wait = math.max(wait, take('gt:' .. group, 'gl:' .. group, r * share, math.max(1, rb * share), 1))
  end
end
-- charge what calls have been using of their estimates (settled again when each ends)
local charge = cost * num('uratio', 1)
local ur = rate_of('u_rate', 'u_rate_until', urate)
if ur > 0 then
  local credit = num('uc', 0)
  local spent = math.min(credit, charge)
  if spent > 0 then redis.call('HSET', S, 'uc', credit - spent) end
  wait = math.max(wait, take('ut', 'ul', ur, uburst > 0 and uburst or 1, charge - spent))
end
if sreset > now and sremain >= 0 then redis.call('HSET', S, 's_remaining', sremain - 1) end
if ureset > now and uremain >= 0 then redis.call('HSET', S, 'u_remaining', uremain - charge) end
redis.call('ZADD', L, now + wait + lease_s, lease)
redis.call('HINCRBY', S, 'n:' .. group, 1)
-- a group wants while it is refused or queued (for a second after: its next ask comes soon)
if wait > 0 then redis.call('HSET', S, 'want:' .. group, now) end
local said = ''
if num('s_rate_until', 0) > now then said = ' (the service: ' .. num('s_rate', 0) .. ' calls/s)' end
return {0, tostring(wait), 'in flight ' .. (limit > 0 and (limit .. ' ' .. source) or 'unlimited') .. said,
        tostring(charge)}
"""
)

RELEASE = (
    _COMMON
    + """
-- probing a quota learned from Retry-After alone: the first raise, the largest, and the most
-- windows held at the highest rate known to hold after a refused probe
local STEP_FIRST, STEP_MOST, HOLD_MOST = 0.05, 0.5, 16
local group, lease = ARGV[1], ARGV[2]
local settle, outcome, latency = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local adaptive, ceiling, retry_after = ARGV[6] == '1', tonumber(ARGV[7]), tonumber(ARGV[8])
if redis.call('ZREM', L, lease) == 1 then redis.call('HINCRBY', S, 'n:' .. group, -1) end
expire_dead()
keep()
-- over-charged units come back as a credit (the bucket's cap would cut them), under-charged
-- ones are a debt of the bucket; the ratio used / estimated steers the next charges
if settle < 0 then redis.call('HSET', S, 'uc', num('uc', 0) - settle) end
if settle > 0 then redis.call('HSET', S, 'ut', num('ut', 0) - settle) end
local estimate, used = tonumber(ARGV[19] or ''), tonumber(ARGV[20] or '')
local headroom_of_release = tonumber(ARGV[21] or '') or 0
if estimate and used and estimate > 0 then
  local ratio = 0.7 * num('uratio', 1) + 0.3 * used / estimate
  redis.call('HSET', S, 'uratio', math.min(10, math.max(0.01, ratio)))
end
local function pause_pace(resume)
  -- a pause earns the pace no tokens: the calls it held back (reserved before it, started
  -- after it) keep their places in the pace, and the calls after them follow at the rate, so
  -- a window after a pause gets no burst on top of its paced calls
  local r = num('s_rate', 0)
  if r <= 0 or num('s_rate_until', 0) <= now then return end
  local buckets = {{'tk', 'tl'}}  -- the job's, and each group's share of it
  for _, g in ipairs(redis.call('ZRANGE', G, 0, -1)) do
    buckets[#buckets + 1] = {'gt:' .. g, 'gl:' .. g}
  end
  for _, b in ipairs(buckets) do
    local tokens_field, last_field = b[1], b[2]
    local last = num(last_field, 0)
    if last > 0 and last < resume then
      local tokens = math.min(1, num(tokens_field, 1) + math.max(0, now - last) * r)
      redis.call('HSET', S, tokens_field, tokens, last_field, resume)
    end
  end
end
local pause = retry_after
local known = num('s_learned', 0) == 1 and num('s_rate_until', 0) > now and num('p_good', 0) > 0
if retry_after > 0 and known then
  -- a window of a learned quota ran out: the service counted at least what held a whole
  -- window (p_good's calls) at the pace in force, so its end is at most the rest of the window
  -- after them away; a whole-second Retry-After may be up to a second later, which would
  -- lose most of the next short window
  local w, r = num('ra_w', 1), num('s_rate', 1) * (1 - headroom_of_release)
  local left = w - num('p_good', 0) * w / math.max(r, 1e-9)
  pause = math.min(retry_after, math.max(0.02, left) + 0.02)
end
local function let_one_through(after)
  -- in ``after`` seconds one call goes first to find whether the window turned, the rest once
  -- it is admitted; a refusal of it pauses to the Retry-After's end
  redis.call('HSET', S, 'trial_end', now + retry_after + 0.02, 'trial_at', now + after)
  return after
end
local trial_end, trial_refused = num('trial_end', 0), false
if retry_after > 0 and trial_end > now then
  if now - latency < num('trial_at', 0) - 0.001 then
    pause = 0  -- a call of the window that set the trial, refused with it: the trial stands
  else
    -- the one call let through at the window's likeliest end was refused: the rest of the pause
    pause, trial_refused = math.min(pause, trial_end - now), true
  end
end
if retry_after > 0 then
  -- a service that states only Retry-After: its windows end where its 429s say, and the calls
  -- it admitted between two ends are its quota per window (whole seconds: Retry-After is)
  local ends, began = now + retry_after, num('ra_start', 0)
  -- not a call of the window that just ended, nor the one let through to find its end
  if ends > began + 0.5 and now >= began and not trial_refused then
    local learned = num('s_learned', 0) == 1 and num('s_rate_until', 0) > now
    if learned then
      -- refused at a probe: back to the highest rate that held a whole window, and probe less
      -- often; refused at a rate that held before (the quota fell): down a twentieth
      local w, r, good, hold = num('ra_w', 1), num('s_rate', 1), num('p_good', 0), num('p_hold', 1)
      if good > 0 and r > good * 1.001 then
        -- a pace that held a whole window paced under a call a window over the quota (a window
        -- holds at least its pace's whole calls but one), so a call a window less never overruns
        -- it: what held may have held by where the calls fell in the windows
        local less = 1 / (w * math.max(0.5, 1 - headroom_of_release))
        r, hold = math.max(0.9 * good, good - less), math.min(HOLD_MOST, hold * 2)
        redis.call('HSET', S, 'p_good', r)
      else
        r = r * 0.95
        redis.call('HSET', S, 'p_good', r)
      end
      redis.call('HSET', S, 's_rate', r, 's_rate_until', now + math.max(600, 2 * w), 'p_step', STEP_FIRST,
                 'p_hold', hold, 'p_next', ends + hold * w, 'p_at', ends)
    elseif began > 0 and num('s_rate_until', 0) <= now then
      -- two windows' lengths averaged: a whole-second Retry-After puts each end up to a
      -- second late
      local before = num('ra_d', 0)
      if before > 0 then
        local w = math.max(1, math.floor((before + ends - began) / 2 + 0.5))
        local q = math.max(1, math.min(num('ra_n', 1), num('ra_q', 1e9)))
        -- a little under what it admitted (a call, or 3% of a small quota): a window's edge may
        -- count a call more or less, and the probes below find the rest
        redis.call('HSET', S, 's_rate', math.max(q - 1, 0.97 * q) / w,
                   's_rate_until', now + math.max(600, 2 * w),
                   's_learned', 1, 'ra_w', w, 'p_good', 0, 'p_step', STEP_FIRST, 'p_hold', 2,
                   'p_next', ends + 2 * w, 'p_at', ends)
        -- the window ends within the last second of the whole-second Retry-After: one call is
        -- let through at its middle, and the rest follow once it is admitted (a refusal of it
        -- pauses to the Retry-After's end); paced from here on, the time lost to a pause to the
        -- Retry-After's end would not come back in the next window as it did in a burst
        if retry_after > 0.5 then
          pause = let_one_through(retry_after - 0.5)
        end
      else
        redis.call('HSET', S, 'ra_d', ends - began, 'ra_q', num('ra_n', 1))
      end
    end
    if pause == retry_after and retry_after > 0.5 and num('s_rate_until', 0) <= now then
      -- still learning: the window ends within the Retry-After's last second, up to a whole
      -- window before it (a refusal late in a 1 s window would lose the next one); one call
      -- let through 0.35 s before its end finds whether it turned: refused a third of the
      -- time, it wins 0.23 s on average (the middle: refused half the time, for 0.25 s)
      pause = let_one_through(retry_after - 0.35)
    end
    redis.call('HSET', S, 'ra_start', ends, 'ra_n', 0)
  end
  local resume = math.max(num('paused', 0), now + pause)
  redis.call('HSET', S, 'paused', resume)
  pause_pace(resume)
end
if outcome == 'ok' then
  if trial_end > 0 and now - latency >= num('trial_at', now) - 0.001 then
    -- let through after the pause: the window turned before this call was sent, which may be
    -- before the Retry-After said (a whole second is up to a second late); the window's
    -- refusals from then on are its own, not the last window's
    redis.call('HDEL', S, 'trial_end', 'trial_at')
    redis.call('HSET', S, 'ra_start', math.min(num('ra_start', now), now - latency))
  end
  redis.call('HINCRBY', S, 'ra_n', 1)  -- calls admitted since the window began
  if num('s_learned', 0) == 1 and num('s_rate_until', 0) > now and num('paused', 0) <= now then
    -- a learned quota is probed upward (as TCP finds a path's rate): each whole window at the
    -- rate in force with no refusal makes it the highest known to hold and, once the hold
    -- since the last refused probe is over, raises the rate by a step that doubles with each
    -- unrefused raise (a quota that rose is found in a few windows)
    local w = num('ra_w', 1)
    if now >= num('p_at', now) + w then
      local r = num('s_rate', 0)
      if r > num('p_good', 0) then redis.call('HSET', S, 'p_good', r) end
      if now >= num('p_next', 0) then
        local step = num('p_step', STEP_FIRST)
        local raised = math.min(STEP_MOST, step * 2)
        redis.call('HSET', S, 's_rate', r * (1 + step), 'p_step', raised, 'p_next', now + w)
      end
      redis.call('HSET', S, 'p_at', now, 's_rate_until', now + math.max(600, 2 * w))
    end
  end
  local cap = num('ss_cap', 0)
  if cap > 0 and now >= num('ss_at', now) + 1 then
    -- before the quota is known, the cap a 429 set doubles with each second unrefused, so it
    -- never becomes the limit of a service faster than two calls in flight allow
    redis.call('HSET', S, 'ss_cap', cap * 2, 'ss_at', now)
  end
elseif outcome == 'overload' and num('s_rate_until', 0) <= now then
  -- a 429 before its quota is known: two calls in flight until the next one tells the window
  -- (the calls in flight when a window's quota runs out are what it refuses)
  redis.call('HSET', S, 'ss_cap', 2, 'ss_at', now)
end
if num('s_rate_until', 0) > now then redis.call('HDEL', S, 'ss_cap') end
local function said(prefix, at)
  local remaining, reset, limit, window = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local exact = ARGV[at + 4] == '1'
  if remaining ~= '' or limit ~= '' then
    redis.call('HSET', S, 'heard', now + 60, 's_learned', 0)  -- the service states its quota
  end
  if reset ~= '' and limit ~= '' and window == '' then
    -- a window the service does not state (X-RateLimit-*) is learned from its resets: the
    -- longest seen lately, as an answer at a window's start sees nearly the whole of it
    -- (windows of a second and more are whole seconds: 0.95 s seen is a 1 s window)
    local seen = tonumber(reset)
    if seen >= 0.9 then seen = math.ceil(seen - 0.1) end
    if seen > 0 and (seen > num(prefix .. '_win', 0) or num(prefix .. '_win_until', 0) <= now) then
      redis.call('HSET', S, prefix .. '_win', seen)
    end
    redis.call('HSET', S, prefix .. '_win_until', now + 60)
    window = tostring(num(prefix .. '_win', 0))
  end
  if remaining ~= '' and reset ~= '' and not exact and tonumber(reset) < 2 and window ~= ''
     and tonumber(window) > 0 then
    -- a reset in whole seconds, under two away, may be up to a second late: waiting for it
    -- could lose most of a short window, whose rate (stated or learned) spaces the calls
    redis.call('HDEL', S, prefix .. '_remaining', prefix .. '_reset')
  elseif remaining ~= '' and reset ~= '' then
    -- what the service said less the calls it may not have seen yet (those in flight); what
    -- this budget counted since, when that is fewer (the service counts in windows: a count
    -- above ours is a new window). It holds calls back in any window, however short: the
    -- rate (stated or learned) spaces the calls, so it is seldom spent before its reset
    local said_left = tonumber(remaining)
    local left = math.max(0, said_left - redis.call('ZCARD', L))
    if num(prefix .. '_reset', 0) > now then
      left = math.min(said_left, math.max(left, num(prefix .. '_remaining', left)))
    end
    redis.call('HSET', S, prefix .. '_remaining', left, prefix .. '_reset', now + tonumber(reset))
  end
  if limit ~= '' and window ~= '' and tonumber(window) > 0 then
    redis.call('HSET', S, prefix .. '_rate', tonumber(limit) / tonumber(window),
               prefix .. '_rate_until', now + math.max(60, 2 * tonumber(window)))
  end
end
said('s', 9)
said('u', 14)
local a = num('aimd', math.min(ceiling, 4))
if adaptive then
  local function cut()
    if now - num('cut', -1e9) >= num('base', 0) then
      a = math.max(1, a * 0.5)
      redis.call('HSET', S, 'cut', now, 'slow', 0)
    end
  end
  if outcome == 'overload' then
    cut()
  elseif outcome == 'ok' then
    local base = num('base', nil)
    if base == nil or latency < base then base = math.max(latency, 0.000001) else base = base * 1.01 end
    redis.call('HSET', S, 'base', base)
    if latency > 2 * base then
      cut()
    else
      local step = 1 / a
      if num('slow', 1) == 1 then step = 1 end
      a = math.min(ceiling, a + step)
    end
  end
  redis.call('HSET', S, 'aimd', a)
end
return {tostring(math.floor(a)), tostring(math.max(0, num('paused', 0) - now))}
"""
)

RENEW = (
    _COMMON
    + """
local group, lease_s = ARGV[1], tonumber(ARGV[2])
redis.call('ZADD', G, now + 10 + lease_s, group)
local kept = 0
for i = 3, #ARGV do
  kept = kept + redis.call('ZADD', L, 'XX', 'CH', now + lease_s, ARGV[i])
end
keep()
return kept
"""
)

# how long the job is still paused (a Retry-After): what a call granted for a paced start asks
# before it starts, as a refusal may have come while it waited
PAUSED = (
    _COMMON
    + """
return tostring(math.max(0, num('paused', 0) - now))
"""
)
