-- Argo CD action discovery for a sluice.dev RevisionUpgrade: abort and resume (the same rules
-- as kubectl sluice upgrade abort|resume). Runs without Lua's string/math libraries.
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
local spec = obj.spec or {}
local aborted = spec.abort == true or phase == "Aborted" or phase == "RollingBack"
local actions = {}
actions["abort"] = {
  ["displayName"] = "Abort: retag moved namespaces back (paced)",
  ["iconClass"] = "fa fa-fw fa-stop-circle",
  ["disabled"] = phase == "Complete" or spec.abort == true,
}
actions["resume"] = {
  ["iconClass"] = "fa fa-fw fa-play-circle",
  ["disabled"] = not (aborted or spec.paused == true or phase == "Paused"),
}
return actions
