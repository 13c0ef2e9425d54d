-- Argo CD action discovery for a sluice.dev WaveGate: release-site (an audited release of a
-- cross-site wait, spec.waitReleases) and emergency (admit every wave at once for this
-- revision, spec.emergency). Runs without Lua's string/math libraries.
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
local spec = obj.spec or {}
local released = {}
for _, r in ipairs(spec.waitReleases or {}) do
  if r.revision == spec.revision then released[r.site] = true end
end
-- The first site a wave waits for that is not released for this revision.
local waited = nil
for _, w in ipairs(spec.waves or {}) do
  for _, wait in ipairs(w.waitFor or {}) do
    if waited == nil and not released[wait.site] then waited = wait.site end
  end
end
local active = phase == "Pending" or phase == "Progressing" or phase == "Soaking" or phase == "WaitingForSite"
local emergency = spec.emergency ~= nil and spec.emergency.revision == spec.revision
local actions = {}
actions["release-site"] = {
  ["displayName"] = "Release a cross-site wait (audited)",
  ["iconClass"] = "fa fa-fw fa-unlock",
  ["disabled"] = waited == nil or not active,
  ["params"] = { { ["name"] = "site", ["default"] = waited or "" }, { ["name"] = "reason" } },
}
actions["emergency"] = {
  ["displayName"] = "Emergency: admit every wave now (audited)",
  ["iconClass"] = "fa fa-fw fa-exclamation-triangle",
  ["disabled"] = emergency or not active,
  ["params"] = { { ["name"] = "reason" } },
}
return actions
