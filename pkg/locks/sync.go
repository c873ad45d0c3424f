//go:build !lockorder

package locks

import "sync"

// Mutex is sync.Mutex.
type Mutex = sync.Mutex

// RWMutex is sync.RWMutex.
type RWMutex = sync.RWMutex
