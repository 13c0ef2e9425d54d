-- Argo CD action discovery for a sluice.dev BundlePin: release (as kubectl sluice unpin),
-- asking for the audited reason. Runs without Lua's string/math libraries.
local phase = ""
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
local spec = obj.spec or {}
local actions = {}
actions["release"] = {
  ["displayName"] = "Release the pin (give the Applications back to automation)",
  ["iconClass"] = "fa fa-fw fa-unlock",
  ["disabled"] = phase == "Released" or phase == "Releasing" or spec.release == true,
  ["params"] = { { ["name"] = "reason" } },
}
return actions
