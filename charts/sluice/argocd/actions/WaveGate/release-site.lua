-- WaveGate release-site: stop waiting for another site's progress with this revision
-- (an entry {site, revision: spec.revision, reason} in spec.waitReleases; wave-gate records it
-- in an Event and in history). Entries for other revisions are dropped: wave-gate honours a
-- release only for spec.revision, and the list holds at most 16.
local site = actionParams["site"]
local reason = actionParams["reason"]
if site == nil or site == "" then error("release-site needs the site to stop waiting for", 0) end
if reason == nil or reason == "" then
  error("release-site needs a reason: a release is audited", 0)
end
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
if phase == "Complete" or phase == "Halted" or phase == "Refused" then
  error("the WaveGate is " .. phase .. ": there is no wait to release", 0)
end
local waited = {}
local names = nil
for _, w in ipairs(obj.spec.waves or {}) do
  for _, wait in ipairs(w.waitFor or {}) do
    if not waited[wait.site] then
      waited[wait.site] = true
      if names == nil then names = wait.site else names = names .. ", " .. wait.site end
    end
  end
end
if names == nil then error("no wave of this WaveGate waits for another site", 0) end
if not waited[site] then
  error("no wave of this WaveGate waits for site " .. site .. ": it waits for " .. names, 0)
end
local kept = {}
for _, r in ipairs(obj.spec.waitReleases or {}) do
  if r.revision == obj.spec.revision then
    if r.site == site then
      error("site " .. site .. " is already released for " .. obj.spec.revision, 0)
    end
    table.insert(kept, r)
  end
end
table.insert(kept, { site = site, revision = obj.spec.revision, reason = reason })
obj.spec.waitReleases = kept
return obj
