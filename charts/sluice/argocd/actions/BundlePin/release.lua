-- BundlePin release: release the pin now (spec.release, spec.releaseReason; revert audits the
-- reason in an Event and its log).
local phase = ""
if obj.status ~= nil and obj.status.phase ~= nil then phase = obj.status.phase end
if phase == "Released" then error("the BundlePin is already released", 0) end
if obj.spec.release == true then
  error("the BundlePin already asks for release (spec.release): wait for revert", 0)
end
local reason = actionParams["reason"]
if reason == nil or reason == "" then
  error("release needs a reason: an explicit release is audited", 0)
end
obj.spec.release = true
obj.spec.releaseReason = reason
return obj
