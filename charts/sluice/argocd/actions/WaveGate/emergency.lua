-- WaveGate emergency: admit every wave at once for spec.revision (spec.emergency with this
-- revision and the reason; wave-gate marks the waves Skipped and records a Warning Event
-- Emergency). Guard it with an Argo CD RBAC policy of its own:
-- action/sluice.dev/WaveGate/emergency.
local reason = actionParams["reason"]
if reason == nil or reason == "" then
  error("emergency needs a reason: it is audited", 0)
end
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
if phase == "Complete" or phase == "Halted" or phase == "Refused" then
  error("the WaveGate is " .. phase .. ": an emergency admits the waves of a change in progress", 0)
end
if obj.spec.emergency ~= nil and obj.spec.emergency.revision == obj.spec.revision then
  error("an emergency is already declared for " .. obj.spec.revision, 0)
end
obj.spec.emergency = { revision = obj.spec.revision, reason = reason }
return obj
