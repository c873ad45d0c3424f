package devices

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
)

// Statfs returns the usage of the filesystem at path. It gives up when ctx
// ends, so a hung filesystem cannot hang the caller; the statfs call itself
// is left to finish in the background.
func Statfs(ctx context.Context, path string) (host.Usage, error) {
	type result struct {
		st  unix.Statfs_t
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		r.err = unix.Statfs(path, &r.st)
		ch <- r
	}()
	select {
	case <-ctx.Done():
		return host.Usage{}, fmt.Errorf("statfs %s: %w", path, ctx.Err())
	case r := <-ch:
		if r.err != nil {
			return host.Usage{}, fmt.Errorf("statfs %s: %w", path, r.err)
		}
		bs := r.st.Bsize
		return host.Usage{
			TotalBytes:     int64(r.st.Blocks) * bs,
			AvailableBytes: int64(r.st.Bavail) * bs,
			UsedBytes:      int64(r.st.Blocks-r.st.Bfree) * bs,
			TotalInodes:    int64(r.st.Files),
			FreeInodes:     int64(r.st.Ffree),
			UsedInodes:     int64(r.st.Files - r.st.Ffree),
		}, nil
	}
}
