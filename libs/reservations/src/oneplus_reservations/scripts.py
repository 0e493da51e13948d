"""The Lua scripts. Each runs atomically inside Redis: a gang is visible whole or not at all."""

# Tokens of epoch e are above e * 2^32: an epoch bumped after a store reset puts every new token above every old one.
EPOCH_SPAN = 2**32

# KEYS: 1 fence, 2 gang, 3 history, 4 gangs, then n GPU keys, then n share keys (same order), then the epoch marker.
# ARGV: 1 job, 2 allocation JSON, 3 lease ms, 4 n, then n milli values (0 = the whole GPU).
RESERVE = r"""
local job, alloc, lease, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local epoch = redis.call('GET', KEYS[4 + 2 * n + 1])
if not epoch then return {0, 'store reset: no epoch marker (the reservation store lost its state)'} end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0, 'job ' .. job .. ' already holds a reservation', redis.call('HGET', KEYS[2], 'token')}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function share_used(key)
  local used = 0
  local kv = redis.call('HGETALL', key)
  for i = 1, #kv, 2 do
    local milli, token, expiry = string.match(kv[i + 1], '^(%d+)|(%d+)|(%d+)$')
    if tonumber(expiry) > now then used = used + tonumber(milli) else redis.call('HDEL', key, kv[i]) end
  end
  return used
end
for i = 1, n do
  local gk, sk, milli = KEYS[4 + i], KEYS[4 + n + i], tonumber(ARGV[4 + i])
  local holder = redis.call('GET', gk)
  if holder then return {0, 'gpu held', gk, holder} end
  local used = share_used(sk)
  if milli == 0 and used > 0 then return {0, 'gpu shared', sk} end
  if milli > 0 and used + milli > 1000 then return {0, 'gpu share full', sk} end
end
local token = redis.call('INCR', KEYS[1])
local floor = tonumber(epoch) * 4294967296
if token <= floor then
  token = floor + 1
  redis.call('SET', KEYS[1], token)
end
local expiry = now + lease
for i = 1, n do
  local gk, sk, milli = KEYS[4 + i], KEYS[4 + n + i], tonumber(ARGV[4 + i])
  if milli == 0 then
    redis.call('SET', gk, job .. '|' .. token, 'PX', lease)
  else
    redis.call('HSET', sk, job, milli .. '|' .. token .. '|' .. expiry)
    local ttl = redis.call('PTTL', sk)
    if ttl < lease then redis.call('PEXPIRE', sk, lease) end
  end
end
local slots = {}
for i = 1, n do slots[i] = (tonumber(ARGV[4 + i]) == 0 and KEYS[4 + i] or KEYS[4 + n + i]) .. '=' .. ARGV[4 + i] end
redis.call('HSET', KEYS[2], 'job', job, 'token', token, 'alloc', alloc, 'slots', table.concat(slots, ','),
  'expiry', expiry, 'ts', now)
redis.call('PEXPIRE', KEYS[2], lease)
redis.call('SADD', KEYS[4], job)
local at = redis.call('XADD', KEYS[3], 'MAXLEN', '~', 1000000, '*', 'op', 'reserve', 'job', job, 'token', token,
  'slots', table.concat(slots, ','))
return {1, token, epoch .. ':' .. at}
"""

# KEYS: 1 gang, 2 history, 3 gangs, 4 the epoch marker. ARGV: 1 job, 2 token (0 = any), 3 reason.
RELEASE = r"""
local job, want, reason = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local token = redis.call('HGET', KEYS[1], 'token')
if not token then redis.call('SREM', KEYS[3], job) return {0, 'no reservation'} end
if want ~= 0 and tonumber(token) ~= want then return {0, 'stale token', token} end
local slots = redis.call('HGET', KEYS[1], 'slots') or ''
for slot in string.gmatch(slots, '([^,]+)') do
  local key, milli = string.match(slot, '^(.*)=(%d+)$')
  if tonumber(milli) == 0 then
    if redis.call('GET', key) == job .. '|' .. token then redis.call('DEL', key) end
  else
    redis.call('HDEL', key, job)
  end
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], job)
local at = redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000000, '*', 'op', 'release', 'job', job, 'token', token,
  'slots', slots, 'reason', reason)
return {1, token, (redis.call('GET', KEYS[4]) or '0') .. ':' .. at}
"""

# KEYS: 1 gang, 2 epoch marker. ARGV: 1 job, 2 token, 3 lease ms.
RENEW = r"""
local job, want, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local token = redis.call('HGET', KEYS[1], 'token')
if not token then
  if redis.call('EXISTS', KEYS[2]) == 0 then return {0, 'store reset'} end
  return {0, 'no reservation'}
end
if tonumber(token) ~= want then return {0, 'stale token', token} end
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + lease
local slots = redis.call('HGET', KEYS[1], 'slots') or ''
for slot in string.gmatch(slots, '([^,]+)') do
  local key, milli = string.match(slot, '^(.*)=(%d+)$')
  if tonumber(milli) == 0 then
    redis.call('PEXPIRE', key, lease)
  else
    redis.call('HSET', key, job, milli .. '|' .. token .. '|' .. expiry)
    if redis.call('PTTL', key) < lease then redis.call('PEXPIRE', key, lease) end
  end
end
redis.call('HSET', KEYS[1], 'expiry', expiry)
redis.call('PEXPIRE', KEYS[1], lease)
return {1, token}
"""

# Put back a reservation the store lost, under the token its ranks already hold (the solver's rebuild after a reset).
# KEYS: 1 gang, 2 history, 3 gangs, then n GPU keys, then n share keys. ARGV: 1 job, 2 token, 3 allocation JSON,
# 4 lease ms, 5 n, then n milli values.
RESTORE = r"""
local job, token, alloc, lease, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local held = redis.call('HGET', KEYS[1], 'token')
if held then
  if held == token then return {1, token} end
  return {0, 'job ' .. job .. ' already holds a reservation', held}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, n do
  local gk, sk, milli = KEYS[3 + i], KEYS[3 + n + i], tonumber(ARGV[5 + i])
  local holder = redis.call('GET', gk)
  if holder then return {0, 'gpu held', gk, holder} end
  if milli == 0 and redis.call('HLEN', sk) > 0 then return {0, 'gpu shared', sk} end
end
local expiry = now + lease
local slots = {}
for i = 1, n do
  local gk, sk, milli = KEYS[3 + i], KEYS[3 + n + i], tonumber(ARGV[5 + i])
  if milli == 0 then
    redis.call('SET', gk, job .. '|' .. token, 'PX', lease)
    slots[i] = gk .. '=0'
  else
    redis.call('HSET', sk, job, milli .. '|' .. token .. '|' .. expiry)
    if redis.call('PTTL', sk) < lease then redis.call('PEXPIRE', sk, lease) end
    slots[i] = sk .. '=' .. ARGV[5 + i]
  end
end
redis.call('HSET', KEYS[1], 'job', job, 'token', token, 'alloc', alloc, 'slots', table.concat(slots, ','),
  'expiry', expiry, 'ts', now)
redis.call('PEXPIRE', KEYS[1], lease)
redis.call('SADD', KEYS[3], job)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000000, '*', 'op', 'restore', 'job', job, 'token', token,
  'slots', table.concat(slots, ','))
return {1, token}
"""
