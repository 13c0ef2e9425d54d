-- Rollout promote-full: promote to canary weight 100 now (spec.promoteFull).
local phase = "Pending"
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
if phase == "Promoted" then error("the Rollout is already promoted: nothing to promote", 0) end
if phase == "Aborted" then error("the Rollout is aborted: retry it before promoting", 0) end
if phase == "Invalid" then error("the Rollout has an invalid spec: fix it before promoting", 0) end
if obj.spec.promoteFull == true then
  error("the Rollout already asks for full promotion (spec.promoteFull)", 0)
end
obj.spec.promoteFull = true
return obj
