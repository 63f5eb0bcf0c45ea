"""The Redis side of ``RedisStore.append`` and ``append_many``: one Lua script, so an append (of one user's events
or of a batch's) is atomic, all or nothing, and one round trip.

It applies exactly the rule `service.http.store.MemoryStore` applies in Python (the contract test runs both):
each event in turn, an exact duplicate (same item, same timestamp as an event in the window, or as one of the
events last cut from the window at its newest timestamp) is dropped; a timestamped event goes after the last
event whose timestamp is not later than its own (a stable insert: equal timestamps keep arrival order) and never
before an event without a timestamp; an event without one goes at the end. Every event's item, a duplicate's
too, becomes the most recent of the seen set. Then the window is cut to its newest ``max_len`` events and the
seen set to its newest ``seen_cap`` items.

Timestamps are compared as the doubles ``cjson`` parses from the JSON Python wrote, and stored only as that
JSON, never re-encoded in Lua (whose number formatting keeps 14 digits).
"""

from __future__ import annotations

# KEYS: per user, three: the window (list of JSON entries), the seen set (zset, score = recording clock), the cut
# ties (list of the entries last cut from the window, all with the newest timestamp that was cut).
# ARGV: max_len, seen_cap, then per user: its number of events, then per event: its JSON entry, its item id, its
# timestamp ('' when none). Returns each user's window length.
# Every key's type is checked before anything is written: a batch whose user holds another program's value
# stores nothing (a script runs to the end, never rolled back, as a MULTI block's commands do after a failed one).
APPEND = """
local max_len, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local kinds = {'list', 'zset', 'list'}
for k = 1, #KEYS do
  local kind = redis.call('TYPE', KEYS[k]).ok
  if kind ~= 'none' and kind ~= kinds[(k - 1) % 3 + 1] then
    return redis.error_reply('WRONGTYPE user ' .. math.floor((k - 1) / 3) .. ' ' .. KEYS[k] ..
                             ' holds a ' .. kind)
  end
end
local function parse(raw)
  local ok, e = pcall(cjson.decode, raw)
  if ok and type(e) == 'table' and type(e.i) == 'string' then
    return e.i, type(e.t) == 'number' and e.t or false
  end
  return false, false
end
local function append(window, seen, cuts, from, to)
  local raw = redis.call('LRANGE', window, 0, -1)
  local items, times = {}, {}
  for k = 1, #raw do items[k], times[k] = parse(raw[k]) end
  local cut_t, cut_items = false, {}
  for _, entry in ipairs(redis.call('LRANGE', cuts, 0, -1)) do
    local i, t = parse(entry)
    if i and t then cut_t = t; cut_items[i] = true end
  end
  local top = redis.call('ZRANGE', seen, -1, -1, 'WITHSCORES')
  local clock = tonumber(top[2] or '0')
  local stored = #raw
  local n, first = stored, stored + 1
  for a = from, to, 3 do
    local entry, item, t = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]) or false
    local dup = t ~= false and t == cut_t and cut_items[item] == true
    if t and not dup then
      for k = 1, n do
        if times[k] == t and items[k] == item then dup = true; break end
      end
    end
    if not dup then
      local pos = n + 1
      if t then
        while pos > 1 and times[pos - 1] and times[pos - 1] > t do pos = pos - 1 end
      end
      table.insert(raw, pos, entry); table.insert(items, pos, item); table.insert(times, pos, t)
      n = n + 1
      if pos < first then first = pos end
    end
    clock = clock + 1
    redis.call('ZADD', seen, clock, item)
  end
  if first <= n then
    if first == 1 then redis.call('DEL', window)
    elseif first <= stored then redis.call('LTRIM', window, 0, first - 2) end
    for s = first, n, 1000 do redis.call('RPUSH', window, unpack(raw, s, math.min(s + 999, n))) end
  end
  if n > max_len then
    for k = 1, n - max_len do
      local t = times[k]
      if t and (cut_t == false or t > cut_t) then redis.call('DEL', cuts); cut_t = t end
      if t and t == cut_t then redis.call('RPUSH', cuts, raw[k]) end
    end
    redis.call('LTRIM', cuts, -cap, -1)
    redis.call('LTRIM', window, -max_len, -1)
  end
  local card = redis.call('ZCARD', seen)
  if card > cap then redis.call('ZREMRANGEBYRANK', seen, 0, card - cap - 1) end
  return math.min(n, max_len)
end
local lengths, a = {}, 3
for u = 0, #KEYS / 3 - 1 do
  local count = tonumber(ARGV[a])
  lengths[u + 1] = append(KEYS[3 * u + 1], KEYS[3 * u + 2], KEYS[3 * u + 3], a + 1, a + 3 * count)
  a = a + 1 + 3 * count
end
return lengths
"""
