package e2e

import (
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/converge-csi/converge/pkg/contract"
)

// The soak's operator: once the faults are over, it does what
// docs/operations.md's runbooks ask of one for the alerts the faults
// raised, as the alerts' runbook_url sends one there, before it holds the
// cluster to "no alert fires".

// followRunbooks stops and starts again the pods of each volume that
// csi-node reports SpaceRanOut (staged while its pool was full: the
// ConvergeSpaceRanOut runbook), so that the volume is unstaged, checked
// and staged again, and waits for them to run.
func (s *soakRun) followRunbooks(units []soakUnit) {
	byClaim := map[string]soakUnit{}
	for _, u := range units {
		for _, cl := range u.claims {
			byClaim[cl] = u
		}
	}
	pvs, err := c.client.CoreV1().PersistentVolumes().List(s.ctx, metav1.ListOptions{})
	if err != nil {
		s.fail(&s.broken, "following the runbooks: %v", err)
		return
	}
	claimOf := map[string]string{} // volume handle → claim
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
			claimOf[pv.Spec.CSI.VolumeHandle] = pv.Spec.ClaimRef.Name
		}
	}
	redo := map[string]bool{}
	for _, n := range s.nodes {
		st, err := n.status()
		if err != nil {
			s.fail(&s.broken, "following the runbooks: %v", err)
			continue
		}
		for _, v := range st.Volumes {
			if u, ok := byClaim[claimOf[v.ID]]; ok && v.Reason == string(contract.SpaceRanOut) {
				redo[u.pod] = true
			}
		}
	}
	// All at once: a long soak leaves dozens, each a deletion the kubelet
	// takes its time over.
	var wg sync.WaitGroup
	for pod := range redo {
		s.logf("runbook ConvergeSpaceRanOut: stopping and starting pod %s again", pod)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.remakePod(pod); err != nil {
				s.fail(&s.broken, "runbook ConvergeSpaceRanOut, pod %s: %v", pod, err)
			}
		}()
	}
	wg.Wait()
	if len(redo) == 0 {
		return
	}
	if err := waitFor(s.ctx, 5*time.Minute, nil, func() error {
		if not := s.unsettled(units); len(not) > 0 {
			return fmt.Errorf("%s", strings.Join(not, "; "))
		}
		return nil
	}); err != nil {
		s.fail(&s.broken, "5 minutes after the runbooks' pods were started again: %v", err)
	}
}

// remakePod deletes pod, waits for it to be gone, and creates it again
// with its spec (less what the API server's admission added: the service
// account's token volume, which it adds again).
func (s *soakRun) remakePod(name string) error {
	pods := c.client.CoreV1().Pods(ns)
	pod, err := pods.Get(s.ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	spec := *pod.Spec.DeepCopy()
	var vols []corev1.Volume
	for _, v := range spec.Volumes {
		if !strings.HasPrefix(v.Name, "kube-api-access-") {
			vols = append(vols, v)
		}
	}
	spec.Volumes = vols
	for i := range spec.Containers {
		var mounts []corev1.VolumeMount
		for _, m := range spec.Containers[i].VolumeMounts {
			if !strings.HasPrefix(m.Name, "kube-api-access-") {
				mounts = append(mounts, m)
			}
		}
		spec.Containers[i].VolumeMounts = mounts
	}
	if err := pods.Delete(s.ctx, name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := waitFor(s.ctx, 3*time.Minute, nil, func() error {
		if _, err := pods.Get(s.ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pod %s not gone (%v)", name, err)
		}
		return nil
	}); err != nil {
		return err
	}
	_, err = pods.Create(s.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: pod.Labels}, Spec: spec}, metav1.CreateOptions{})
	return err
}

// steadyFor is how long each container of converge's pods must have run,
// unrestarted, for the soak to call converge settled.
const steadyFor = 20 * time.Second

// convergeSteady waits up to 5 minutes for converge's own pods (csi-node
// and its sidecars, the node agent, converge-controller) to be Ready with
// every container running for steadyFor: a kill late in the plan leaves a
// container in the kubelet's back-off for minutes, and what it restarts
// after the soak settled would count as unexpected.
func (s *soakRun) convergeSteady() {
	err := waitFor(s.ctx, 5*time.Minute, nil, func() error {
		pods, err := c.client.CoreV1().Pods("").List(s.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var not []string
		for _, p := range pods.Items {
			if !hasPrefix(p.Name, convergePods) || p.DeletionTimestamp != nil {
				continue
			}
			if !podReady(&p) {
				not = append(not, p.Name+" not Ready")
				continue
			}
			for _, st := range p.Status.ContainerStatuses {
				if r := st.State.Running; r == nil || time.Since(r.StartedAt.Time) < steadyFor {
					not = append(not, p.Name+"/"+st.Name+" not running for "+steadyFor.String())
				}
			}
		}
		if len(not) > 0 {
			return fmt.Errorf("%s", strings.Join(not, ", "))
		}
		return nil
	})
	if err != nil {
		s.fail(&s.broken, "converge's pods not steady 5 minutes after the faults: %v", err)
	}
}
