package devices

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FIEMAP (linux/fiemap.h), which x/sys does not wrap: FS_IOC_FIEMAP is
// _IOWR('f', 11, struct fiemap).
const (
	fsIocFiemap        = 0xC020660B
	fiemapHeader       = 32 // struct fiemap without its extents
	fiemapExtentSize   = 56 // struct fiemap_extent
	fiemapExtentLast   = 0x1
	fiemapExtentShared = 0x2000
	// fiemapBatch is how many extents one ioctl returns at most.
	fiemapBatch = 256
)

// SharedBytes returns how much of the file at path is in extents it shares
// with other files (reflinks): space a write to them must allocate anew.
func SharedBytes(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, fiemapHeader+fiemapBatch*fiemapExtentSize)
	var shared int64
	var start uint64
	for {
		clear(buf)
		binary.NativeEndian.PutUint64(buf[0:], start)            // fm_start
		binary.NativeEndian.PutUint64(buf[8:], ^uint64(0)-start) // fm_length: to the end
		binary.NativeEndian.PutUint32(buf[24:], fiemapBatch)     // fm_extent_count
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			return 0, fmt.Errorf("FIEMAP %s: %w", path, errno)
		}
		n := int(binary.NativeEndian.Uint32(buf[20:])) // fm_mapped_extents
		if n == 0 {
			return shared, nil
		}
		for i := range n {
			e := buf[fiemapHeader+i*fiemapExtentSize:]
			logical, length := binary.NativeEndian.Uint64(e[0:]), binary.NativeEndian.Uint64(e[16:])
			flags := binary.NativeEndian.Uint32(e[40:])
			if flags&fiemapExtentShared != 0 {
				shared += int64(length)
			}
			if flags&fiemapExtentLast != 0 {
				return shared, nil
			}
			start = logical + length
		}
	}
}
