//! The Lua scripts. Each runs atomically in Redis; the apply and purge
//! scripts are bounded by the caller (ops per call, members per call).

/// Apply one worker's key operations.
///
/// `KEYS[1]` worker set, `KEYS[2]` worker registry, `KEYS[3]` the worker's
/// lease, `KEYS[4..]` one block hash per op. `ARGV[1]` worker field,
/// `ARGV[2]` TTL (ms), `ARGV[3]` op codes (`g`/`c` add GPU/CPU, `G`/`C`
/// remove, `p` purge), one byte per op, `ARGV[4]` fencing token: unless
/// empty, the call fails with `KVSTEER_FENCED` (changing nothing) when the
/// lease does not hold exactly that value.
/// Returns the change in the worker set's size (entries created − removed).
pub const APPLY: &str = r#"
if ARGV[4] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[4] then
  return redis.error_reply('KVSTEER_FENCED write lease not held')
end
local field = ARGV[1]
local ttl = tonumber(ARGV[2])
local ops = ARGV[3]
local wset = KEYS[1]
local delta = 0
for i = 1, #ops do
  local op = string.sub(ops, i, i)
  local key = KEYS[i + 3]
  local packed = tonumber(redis.call('HGET', key, field)) or 0
  local gpu = packed % 65536
  local cpu = math.floor(packed / 65536)
  if op == 'g' or op == 'c' then
    if op == 'g' then
      if gpu < 65535 then gpu = gpu + 1 end
    elseif cpu < 65535 then
      cpu = cpu + 1
    end
    redis.call('HSET', key, field, gpu + cpu * 65536)
    redis.call('PEXPIRE', key, ttl)
    delta = delta + redis.call('SADD', wset, key)
  else
    if op == 'G' then
      if gpu > 0 then gpu = gpu - 1 end
    elseif op == 'C' then
      if cpu > 0 then cpu = cpu - 1 end
    else
      gpu = 0
      cpu = 0
    end
    if gpu == 0 and cpu == 0 then
      if packed ~= 0 then redis.call('HDEL', key, field) end
      delta = delta - redis.call('SREM', wset, key)
    elseif gpu + cpu * 65536 ~= packed then
      redis.call('HSET', key, field, gpu + cpu * 65536)
      redis.call('PEXPIRE', key, ttl)
    end
  end
end
if redis.call('EXISTS', wset) == 1 then
  redis.call('PEXPIRE', wset, ttl)
end
redis.call('SADD', KEYS[2], field)
redis.call('PEXPIRE', KEYS[2], ttl)
return delta
"#;

/// Drop up to `ARGV[2]` of a worker's entries: pops block key names from the
/// worker set `KEYS[1]` and deletes field `ARGV[1]` from each. Fenced like
/// [`APPLY`] by the lease `KEYS[2]` and token `ARGV[3]`. Returns the number
/// popped (0 when the set is empty or gone).
pub const PURGE: &str = r#"
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[3] then
  return redis.error_reply('KVSTEER_FENCED write lease not held')
end
local members = redis.call('SPOP', KEYS[1], tonumber(ARGV[2]))
for _, key in ipairs(members) do
  redis.call('HDEL', key, ARGV[1])
end
return #members
"#;

/// Longest-prefix walk over `KEYS` (the prompt's chain, in order). Returns a
/// flat array `worker, gpu_blocks, cpu_blocks, …` in first-key field order;
/// stops at the first key no surviving worker holds.
pub const LOOKUP: &str = r#"#!lua flags=no-writes
local first = redis.call('HGETALL', KEYS[1])
local workers, gpu, cpu = {}, {}, {}
for i = 1, #first, 2 do
  local w = first[i]
  local packed = tonumber(first[i + 1]) or 0
  workers[#workers + 1] = w
  gpu[w] = (packed % 65536 > 0) and 1 or 0
  cpu[w] = 1
end
local alive = workers
local function hit(w, v, d)
  cpu[w] = d
  if gpu[w] == d - 1 and (tonumber(v) or 0) % 65536 > 0 then gpu[w] = d end
end
for d = 2, #KEYS do
  local n = #alive
  if n == 0 then break end
  if n == 1 then
    -- The common deep case: one worker left, no table churn.
    local w = alive[1]
    local v = redis.call('HGET', KEYS[d], w)
    if v then hit(w, v, d) else break end
  else
    local vals = redis.call('HMGET', KEYS[d], unpack(alive))
    local next = {}
    for j, w in ipairs(alive) do
      if vals[j] then
        hit(w, vals[j], d)
        next[#next + 1] = w
      end
    end
    alive = next
  end
end
local out = {}
for _, w in ipairs(workers) do
  out[#out + 1] = tonumber(w) or -1
  out[#out + 1] = gpu[w]
  out[#out + 1] = cpu[w]
end
return out
"#;

/// One lease round for several workers: `KEYS` are lease keys, `ARGV[1]`
/// this replica's id, `ARGV[2]` the lease TTL (ms), `ARGV[3]` one byte per
/// key, `1` = acquire if free. A lease holding `ARGV[1]` is extended
/// (compare-and-extend); a free one is taken (`SET PX`, as `SET NX` would)
/// only where asked. Returns each lease's holder afterwards (`""` = free).
pub const LEASES: &str = r#"
local out = {}
for i, key in ipairs(KEYS) do
  local cur = redis.call('GET', key)
  if cur == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
  elseif not cur and string.sub(ARGV[3], i, i) == '1' then
    redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
    cur = ARGV[1]
  end
  out[i] = cur or ''
end
return out
"#;

/// Compare-and-delete of the leases `KEYS` that hold `ARGV[1]` (graceful
/// shutdown: another replica takes over at once). Returns how many.
pub const RELEASE: &str = r#"
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    n = n + 1
  end
end
return n
"#;
