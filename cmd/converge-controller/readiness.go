package main

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
)

// readiness is what the node agent's /readyz answers: ready once csi-node
// answered the last question whether it serves ControllerModifyVolume
// and, where it does, the agent's caches filled; so an agent that hands,
// or rightly has nothing to hand (csi-node does not advertise
// MODIFY_VOLUME), is ready. One that waits for csi-node, whose hands
// would reach nothing, or for its caches is not: kubectl rollout status
// and the pod's Ready show it, where nothing did before.
type readiness struct {
	csiAddress string
	// mu guards csiNode and caches.
	mu sync.Mutex
	// csiNode is why csi-node is not known to answer, "" once it answered
	// the last question; caches why the agent does not hand yet, "" once
	// its caches filled or while there is nothing to hand.
	csiNode, caches string
}

func newReadiness(csiAddress string) *readiness {
	return &readiness{csiAddress: csiAddress, csiNode: fmt.Sprintf("csi-node at %s has not answered yet", csiAddress)}
}

// asked records a question to csi-node: err nil when it answered.
func (r *readiness) asked(err error) {
	why := ""
	if err != nil {
		why = fmt.Sprintf("csi-node at %s does not answer: %v", r.csiAddress, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.csiNode = why
}

// filling records why the agent does not hand yet; "" when it hands, or
// has nothing to hand.
func (r *readiness) filling(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.caches = why
}

// check answers /readyz: nil when ready, else why not.
func (r *readiness) check(*http.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.csiNode != "":
		return errors.New(r.csiNode)
	case r.caches != "":
		return errors.New(r.caches)
	}
	return nil
}

// checks are the node agent's probes: /readyz, and /healthz, which
// answers while the process serves. The liveness probe asks /healthz
// alone: a csi-node that is down makes the agent unready, and a restart
// of the agent would mend nothing.
func (r *readiness) checks() map[string]func(*http.Request) error {
	return map[string]func(*http.Request) error{
		"/healthz": func(*http.Request) error { return nil },
		"/readyz":  r.check,
	}
}
