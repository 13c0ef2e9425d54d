-- Rollout abort: canary weight 0, cohort and mirror rules removed (spec.abort).
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
if phase == "Aborted" or obj.spec.abort == true then
  error("the Rollout is already aborted (spec.abort)", 0)
end
obj.spec.abort = true
return obj
