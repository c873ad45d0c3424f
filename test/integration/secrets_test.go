package integration

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/test/testenv"
)

// TestSecretsNeverLogged runs the plugin at its most verbose (request
// bodies at V(5)) and sends secrets with every RPC that carries them, in
// requests that succeed and in requests that fail: the secret values appear
// neither in the log nor in any answer.
func TestSecretsNeverLogged(t *testing.T) {
	p := testenv.New(t, "-v", "5")
	p.Start()
	const secret = "s3cr3t-do-not-log-8d1f"
	secrets := map[string]string{"password": secret, "token": secret + "-2"}
	n, c := p.Node(), p.Controller()
	staging := mkdir(t, filepath.Join(p.Root, "staging-s"))
	target := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-s")), "mount")

	// answers collects the answers of requests meant to fail.
	var answers []error
	call := func(err error) { answers = append(answers, err) }
	_, err := c.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "vol-s", CapacityRange: &csi.CapacityRange{RequiredBytes: volSize}, VolumeCapabilities: []*csi.VolumeCapability{rwo}, Secrets: secrets})
	must(t, "create", err)
	_, err = c.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "bad/name", VolumeCapabilities: []*csi.VolumeCapability{rwo}, Secrets: secrets})
	call(err)
	_, err = n.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: vid("vol-s"), StagingTargetPath: staging, VolumeCapability: rwo, Secrets: secrets})
	must(t, "stage", err)
	_, err = n.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: vid("vol-s"), StagingTargetPath: staging + "-x", VolumeCapability: rwo, Secrets: secrets})
	call(err)
	_, err = n.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: vid("vol-s"), StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo, Secrets: secrets})
	must(t, "publish", err)
	_, err = n.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: vid("vol-s"), StagingTargetPath: staging, TargetPath: target, VolumeCapability: flags1("bind"), Secrets: secrets})
	call(err)
	unpublish(t, p, vid("vol-s"), target)
	unstage(t, p, vid("vol-s"), staging)
	_, err = c.ValidateVolumeCapabilities(ctx(t), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vid("vol-s"), VolumeCapabilities: []*csi.VolumeCapability{rwo}, Secrets: secrets})
	must(t, "validate", err)
	_, err = c.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: vid("vol-s"), Secrets: secrets})
	must(t, "delete", err)

	log := p.Log()
	if !strings.Contains(log, "NodeStageVolume") || !strings.Contains(log, "***stripped***") {
		t.Fatalf("the log holds no request bodies; the test would prove nothing:\n%s", log)
	}
	if strings.Contains(log, secret) {
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, secret) {
				t.Errorf("secret logged: %s", line)
			}
		}
	}
	for _, err := range answers {
		if status.Code(err) == codes.OK {
			t.Errorf("a request meant to fail succeeded")
		}
		if msg := status.Convert(err).Message(); strings.Contains(msg, secret) {
			t.Errorf("secret in an answer: %s", msg)
		}
	}
}

func flags1(f ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: f}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}
