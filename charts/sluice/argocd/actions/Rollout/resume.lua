-- Rollout resume: stop holding (spec.paused = false).
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
if phase == "Aborted" then error("the Rollout is aborted: use retry to start it again", 0) end
if obj.spec.paused ~= true and phase ~= "Paused" then error("the Rollout is not paused", 0) end
obj.spec.paused = false
return obj
