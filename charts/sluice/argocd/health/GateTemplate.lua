-- Argo CD health of a sluice.dev GateTemplate
-- (resource.customizations.health.sluice.dev_GateTemplate). A GateTemplate has no status: the
-- API server validated it on admission, so once it exists it is Healthy.
local hs = { status = "Healthy", message = "gate template" }
if obj.spec ~= nil and obj.spec.description ~= nil then
  hs.message = obj.spec.description
end
return hs
