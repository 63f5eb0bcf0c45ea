"""The Redis side of ``RedisStore.append`` and ``append_many``: one Lua script, so an append (of one user's events
or of a batch's) is atomic, all or nothing, and one round trip.

It applies exactly the rule `service.http.store.MemoryStore` applies in Python (the contract test runs both):
each event in turn, an exact duplicate (same item, same timestamp as an event in the window, or as one of the
events last cut from the window at its newest timestamp) is dropped; a timestamped event goes after the last
event whose timestamp is not later than its own (a stable insert: equal timestamps keep arrival order) and never
before an event without a timestamp; an event without one goes at the end. Every event's item, a duplicate's
too, becomes the most recent of the seen set. Then the window is cut to its newest ``max_len`` events and the
seen set to its newest ``seen_cap`` items.

What an event costs does not grow with what the user has seen: the window is read whole (``max_len`` entries,
the model's), but the seen set and the cut ties are sorted sets touched one member at a time (ZADD, ZSCORE, the
cap enforced by ZREMRANGEBYRANK), never read whole. (The cut ties were a list decoded whole on every append, so
a user with many events cut at one timestamp made each of their appends block Redis: issue 66;
`seqrec bench seen-set` measures it now.)

Timestamps are compared as the doubles ``cjson`` parses from the JSON Python wrote, and stored only as that
JSON, never re-encoded in Lua (whose number formatting keeps 14 digits): the cut ties' timestamp is kept as the
JSON entry of an event cut at it.

Keys written by the release before (``{prefix}history:{user}``, ``seen:{user}``, ``cut:{user}`` a list) are
converted on the user's first append: the window copied (at most ``max_len`` entries), the seen set renamed, the
cut ties' list turned into the sorted set (once, O(its length)). Those names are the only keys outside the user's
hash slot; a store without them (``legacy_keys=False``) passes four keys per user, all in one slot.
"""

from __future__ import annotations

# KEYS: per user, ARGV[3] of them (4, or 7 with the previous release's names): the window (list of JSON entries),
# the seen set (zset, score = recording clock), the cut ties (zset of the items last cut from the window, all at
# one timestamp; score = order of cutting), that timestamp (string: the JSON entry of an event cut at it); then the
# previous release's window, seen set and cut ties (a list of JSON entries).
# ARGV: max_len, seen_cap, keys per user, then per user: its number of events, then per event: its JSON entry, its
# item id, its timestamp ('' when none). Returns each user's window length.
# Every key's type is checked before anything is written: a batch whose user holds another program's value
# stores nothing (a script runs to the end, never rolled back, as a MULTI block's commands do after a failed one).
APPEND = """
local max_len, cap, per = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local kinds = {'list', 'zset', 'zset', 'string', 'list', 'zset', 'list'}
for k = 1, #KEYS do
  local kind = redis.call('TYPE', KEYS[k]).ok
  if kind ~= 'none' and kind ~= kinds[(k - 1) % per + 1] then
    return redis.error_reply('WRONGTYPE user ' .. math.floor((k - 1) / per) .. ' ' .. KEYS[k] ..
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
local function migrate(window, seen, cuts, cut_at, old_window, old_seen, old_cuts)
  if redis.call('EXISTS', window) == 1 then return end
  -- The first write is an RPUSH (Redis refuses it past maxmemory, as it refuses the append; a RENAME it would take,
  -- and every later write of the script with it). The old window holds at most max_len entries.
  local entries = redis.call('LRANGE', old_window, 0, -1)
  for s = 1, #entries, 1000 do redis.call('RPUSH', window, unpack(entries, s, math.min(s + 999, #entries))) end
  if #entries > 0 then redis.call('DEL', old_window) end
  if redis.call('EXISTS', old_seen) == 1 then redis.call('RENAME', old_seen, seen) end
  if redis.call('EXISTS', old_cuts) == 0 then return end
  local order = 0
  for _, entry in ipairs(redis.call('LRANGE', old_cuts, 0, -1)) do
    local i, t = parse(entry)
    if i and t then
      order = order + 1
      redis.call('ZADD', cuts, order, i)
      redis.call('SET', cut_at, entry)
    end
  end
  redis.call('DEL', old_cuts)
end
local function append(window, seen, cuts, cut_at, from, to)
  local raw = redis.call('LRANGE', window, 0, -1)
  local items, times = {}, {}
  for k = 1, #raw do items[k], times[k] = parse(raw[k]) end
  local cut_entry = redis.call('GET', cut_at)
  local cut_t = false
  if cut_entry then local _, t = parse(cut_entry); cut_t = t end
  local top = redis.call('ZRANGE', seen, -1, -1, 'WITHSCORES')
  local clock = tonumber(top[2] or '0')
  local stored = #raw
  local n, first = stored, stored + 1
  for a = from, to, 3 do
    local entry, item, t = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]) or false
    local dup = t ~= false and t == cut_t and redis.call('ZSCORE', cuts, item) ~= false
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
    local last = redis.call('ZRANGE', cuts, -1, -1, 'WITHSCORES')
    local order = tonumber(last[2] or '0')
    for k = 1, n - max_len do
      local t = times[k]
      if t and (cut_t == false or t > cut_t) then
        redis.call('UNLINK', cuts); cut_t = t; order = 0
        redis.call('SET', cut_at, raw[k])
      end
      if t and t == cut_t then order = order + 1; redis.call('ZADD', cuts, order, items[k]) end
    end
    local cut_card = redis.call('ZCARD', cuts)
    if cut_card > cap then redis.call('ZREMRANGEBYRANK', cuts, 0, cut_card - cap - 1) end
    redis.call('LTRIM', window, -max_len, -1)
  end
  local card = redis.call('ZCARD', seen)
  if card > cap then redis.call('ZREMRANGEBYRANK', seen, 0, card - cap - 1) end
  return math.min(n, max_len)
end
local lengths, a = {}, 4
for u = 0, #KEYS / per - 1 do
  local k = per * u
  if per == 7 then migrate(unpack(KEYS, k + 1, k + 7)) end
  local count = tonumber(ARGV[a])
  lengths[u + 1] = append(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], a + 1, a + 3 * count)
  a = a + 1 + 3 * count
end
return lengths
"""


def user_keys(prefix: str, user_id: str) -> list[str]:
    """A user's window, seen set, cut ties and their timestamp, tagged ``{user_id}`` (one hash slot)."""
    tagged = f"{prefix}{{{user_id}}}:"
    return [f"{tagged}history", f"{tagged}seen", f"{tagged}cut", f"{tagged}cut_at"]
