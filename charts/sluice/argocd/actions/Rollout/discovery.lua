-- Argo CD action discovery for a sluice.dev Rollout: which of promote, promote-full, abort,
-- pause, resume and retry apply to the Rollout as it is (the same rules as kubectl sluice).
-- Runs without Lua's string/math libraries (Argo CD opens only base, table and a safe os).
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
local spec = obj.spec or {}
local step = nil
if obj.status ~= nil then step = obj.status.currentStepIndex end
local finished = phase == "Promoted" or phase == "Aborted" or phase == "Invalid"
local through = spec.promoteThroughStep
local actions = {}
actions["promote"] = {
  ["displayName"] = "Promote: complete the current step",
  ["iconClass"] = "fa fa-fw fa-forward",
  ["disabled"] = finished or step == nil or (through ~= nil and through >= step),
}
actions["promote-full"] = {
  ["displayName"] = "Promote fully (canary weight 100)",
  ["iconClass"] = "fa fa-fw fa-fast-forward",
  ["disabled"] = finished or spec.promoteFull == true,
}
actions["abort"] = {
  ["displayName"] = "Abort (canary weight 0)",
  ["iconClass"] = "fa fa-fw fa-stop-circle",
  ["disabled"] = phase == "Aborted" or spec.abort == true,
}
actions["pause"] = {
  ["iconClass"] = "fa fa-fw fa-pause-circle",
  ["disabled"] = spec.paused == true or phase == "Promoted" or phase == "Aborted",
}
actions["resume"] = {
  ["iconClass"] = "fa fa-fw fa-play-circle",
  ["disabled"] = phase == "Aborted" or not (spec.paused == true or phase == "Paused"),
}
actions["retry"] = {
  ["displayName"] = "Retry from the first step",
  ["iconClass"] = "fa fa-fw fa-redo",
  ["disabled"] = not (phase == "Aborted" or spec.abort == true),
}
return actions
