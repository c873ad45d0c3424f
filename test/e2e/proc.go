package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// proc is one daemon of the cluster, started by the suite. Its output goes
// to <logDir>/<name>.log, appended across restarts.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	// target is the process signals go to when it is not cmd's: the
	// daemon that nsenter runs and waits for (nodeNS.start).
	target *os.Process
	done   chan struct{}
	err    error // of Wait, once done is closed
}

func startProc(logDir, name string, bin string, args ...string) (*proc, error) {
	return startProcEnv(logDir, name, nil, bin, args...)
}

// startProcEnv is startProc with env added to the suite's environment.
func startProcEnv(logDir, name string, env []string, bin string, args ...string) (*proc, error) {
	log := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "==== %s %s %v\n", time.Now().Format(time.RFC3339Nano), bin, args)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	// Its own process group, so that a signal to the suite's terminal does
	// not reach it before the suite has taken the cluster down in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, log: log, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig unless the process has already ended. os.Process signals
// through a pidfd, so a recycled PID is never hit.
func (p *proc) signal(sig syscall.Signal) {
	if p.exited() {
		return
	}
	if p.target != nil {
		p.target.Signal(sig)
		return
	}
	p.cmd.Process.Signal(sig)
}

// stop sends SIGTERM, then SIGKILL after grace, and waits for the exit.
func (p *proc) stop(grace time.Duration) error {
	if p == nil {
		return nil
	}
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.signal(syscall.SIGKILL)
		<-p.done
	}
	var ee *exec.ExitError
	if p.err != nil && !errors.As(p.err, &ee) {
		return p.err
	}
	return nil
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}
