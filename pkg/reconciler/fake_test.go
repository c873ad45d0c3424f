package reconciler

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// fakeWorld is an in-memory device layer: loop devices, filesystems on
// them, a mount table and directories. It implements every interface the
// reconciler consumes.
type fakeWorld struct {
	// mu guards every field below.
	mu       sync.Mutex
	dataDir  string
	images   map[string]bool
	loops    map[string]state.Loop // by backing file
	fs       map[string]string     // image -> filesystem type, as on disk
	mounts   []state.Mount
	dirs     map[string]bool
	nextLoop uint32
	calls    []string
	// fail maps a call ("attach", "mount <target>", "bind <target>", ...)
	// to the error it returns.
	fail map[string]error
	// hold, when set for a call, blocks that call until the channel closes.
	hold map[string]chan struct{}
	// started receives the name of each call as it begins.
	started chan string
	// corrupt maps a mount point to the error a stat of it returns.
	corrupt map[string]error
	// deadSuper marks images whose superblock stays shut down across
	// remounts, as when a container still holds the filesystem.
	deadSuper map[string]bool
}

func newFakeWorld() *fakeWorld {
	return &fakeWorld{
		dataDir:   "/data",
		images:    map[string]bool{},
		loops:     map[string]state.Loop{},
		fs:        map[string]string{},
		dirs:      map[string]bool{},
		fail:      map[string]error{},
		hold:      map[string]chan struct{}{},
		started:   make(chan string, 100),
		corrupt:   map[string]error{},
		deadSuper: map[string]bool{},
	}
}

func (w *fakeWorld) call(name string) error {
	w.mu.Lock()
	w.calls = append(w.calls, name)
	h := w.hold[name]
	err := w.fail[name]
	w.mu.Unlock()
	w.started <- name
	if h != nil {
		<-h
	}
	return err
}

func (w *fakeWorld) Calls() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.calls...)
}

func (w *fakeWorld) Observe() (*state.Snapshot, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	loops := make([]state.Loop, 0, len(w.loops))
	for _, l := range w.loops {
		loops = append(loops, l)
	}
	return state.NewSnapshot(append([]state.Mount(nil), w.mounts...), loops), nil
}

func (w *fakeWorld) CheckMount(path string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.corrupt[path]
}

func (w *fakeWorld) Keep(dev string) error {
	if err := w.call("keep " + dev); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, l := range w.loops {
		if l.Device == dev {
			l.AutoClear = false
			w.loops[k] = l
		}
	}
	return nil
}

func (w *fakeWorld) Path(id string) string { return filepath.Join(w.dataDir, id+".img") }

func (w *fakeWorld) IDOf(path string) (string, bool) {
	if filepath.Dir(path) != w.dataDir {
		return "", false
	}
	return strings.CutSuffix(filepath.Base(path), ".img")
}

func (w *fakeWorld) Size(id string) (int64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.images[id] {
		return 0, os.ErrNotExist
	}
	return 64 << 20, nil
}

func (w *fakeWorld) Attach(image string) (string, error) {
	if err := w.call("attach"); err != nil {
		return "", err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nextLoop
	w.nextLoop++
	l := state.Loop{Device: fmt.Sprintf("/dev/loop%d", n), Dev: state.DevNum{Major: 7, Minor: n}, BackingFile: image}
	w.loops[image] = l
	return l.Device, nil
}

func (w *fakeWorld) Detach(dev string) error {
	if err := w.call("detach"); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, l := range w.loops {
		if l.Device == dev {
			delete(w.loops, k)
		}
	}
	return nil
}

func (w *fakeWorld) DiskFormat(dev string) (string, error) {
	if err := w.call("blkid"); err != nil {
		return "", err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fs[w.imageOf(dev)], nil
}

// imageOf returns the backing file of a device; w.mu must be held.
func (w *fakeWorld) imageOf(dev string) string {
	for image, l := range w.loops {
		if l.Device == dev {
			return image
		}
	}
	return ""
}

func (w *fakeWorld) devOf(device string) (state.DevNum, bool) {
	for _, l := range w.loops {
		if l.Device == device {
			return l.Dev, true
		}
	}
	return state.DevNum{}, false
}

func (w *fakeWorld) FormatAndMount(dev, target, fsType string, options []string) error {
	if err := w.call("mount " + target); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	num, ok := w.devOf(dev)
	if !ok {
		return fmt.Errorf("no device %s", dev)
	}
	image := w.imageOf(dev)
	if w.fs[image] == "" {
		w.calls = append(w.calls, "mkfs "+dev)
		w.fs[image] = fsType
	}
	w.mounts = append(w.mounts, state.Mount{Path: target, Dev: num, Root: "/", Source: dev, FsType: w.fs[image], Shutdown: w.deadSuper[image]})
	return nil
}

// damage sets superblock flags on every mount of image's filesystem, as
// the kernel does after an error (read-only) or a shutdown.
func (w *fakeWorld) damage(image string, shutdown, readOnly bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.loops[image]
	for i := range w.mounts {
		if w.mounts[i].Dev == l.Dev {
			w.mounts[i].Shutdown = w.mounts[i].Shutdown || shutdown
			w.mounts[i].SuperReadOnly = w.mounts[i].SuperReadOnly || readOnly
		}
	}
}

func (w *fakeWorld) BindMount(source, target string, options []string) error {
	if err := w.call("bind " + target); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.mounts) - 1; i >= 0; i-- {
		if m := w.mounts[i]; m.Path == source {
			m.Path = target
			w.mounts = append(w.mounts, m)
			return nil
		}
	}
	return fmt.Errorf("%s is not mounted", source)
}

func (w *fakeWorld) Unmount(target string) error {
	if err := w.call("unmount " + target); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.mounts) - 1; i >= 0; i-- {
		if w.mounts[i].Path == target {
			w.mounts = append(w.mounts[:i], w.mounts[i+1:]...)
			return nil
		}
	}
	return nil
}

func (w *fakeWorld) CheckDir(path string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.dirs[path] {
		return fmt.Errorf("%s: %w", path, os.ErrNotExist)
	}
	return nil
}

func (w *fakeWorld) Mkdir(path string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.dirs[filepath.Dir(path)] {
		return os.ErrNotExist
	}
	w.dirs[path] = true
	return nil
}

func (w *fakeWorld) Remove(path string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.mounts {
		if m.Path == path {
			return errors.New("EBUSY")
		}
	}
	delete(w.dirs, path)
	return nil
}

var (
	_ Observer    = (*fakeWorld)(nil)
	_ Loops       = (*fakeWorld)(nil)
	_ Filesystems = (*fakeWorld)(nil)
	_ Paths       = (*fakeWorld)(nil)
	_ Images      = (*fakeWorld)(nil)
	_ Loops       = devices.LoopDevices{}
	_ Filesystems = (*devices.Mounter)(nil)
	_ Paths       = (*devices.Paths)(nil)
	_ Images      = (*devices.Images)(nil)
	_ Observer    = (*devices.Observer)(nil)
)
