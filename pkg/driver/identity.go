package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// identity implements csi.IdentityServer.
type identity struct {
	csi.UnimplementedIdentityServer
	name, version string
	ready         func() bool
	// snapshotAccessibility advertises SNAPSHOT_ACCESSIBILITY_CONSTRAINTS
	// (the SnapshotAccessibility feature).
	snapshotAccessibility bool
}

func (i *identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: i.name, VendorVersion: i.version}, nil
}

func (i *identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	caps := []*csi.PluginCapability{}
	services := []csi.PluginCapability_Service_Type{
		csi.PluginCapability_Service_CONTROLLER_SERVICE,
		csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS,
		// Group snapshots of a node's volumes (controller.GroupService).
		csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE,
	}
	if i.snapshotAccessibility {
		// A snapshot is a file on this node's disk: it restores here only,
		// and every Snapshot answered names this node (KEP-5943).
		services = append(services, csi.PluginCapability_Service_SNAPSHOT_ACCESSIBILITY_CONSTRAINTS)
	}
	for _, t := range services {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: t},
		}})
	}
	caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{
		VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE},
	}})
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe reports ready only once start-up reconstruction has finished.
func (i *identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(i.ready())}, nil
}
