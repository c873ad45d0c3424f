package capacity

import (
	"math"
	"testing"
)

const mi = 1 << 20

func TestAvailable(t *testing.T) {
	for _, tc := range []struct {
		name        string
		free, guard int64
		ratio       float64
		images      []Image
		thick, thin int64
	}{
		{name: "empty", free: 300 * mi, ratio: 1, thick: 300 * mi, thin: 300 * mi},
		{name: "a fully allocated thick image is in the free space already",
			free: 172 * mi, ratio: 1, images: []Image{{Size: 128 * mi, Allocated: 128 * mi}},
			thick: 172 * mi, thin: 172 * mi},
		{name: "an old sparse image is owed its holes",
			free: 290 * mi, ratio: 1, images: []Image{{Size: 128 * mi, Allocated: 10 * mi}},
			thick: 172 * mi, thin: 172 * mi},
		{name: "a thin image at ratio 1 holds its whole promise",
			free: 290 * mi, ratio: 1, images: []Image{{Size: 128 * mi, Allocated: 10 * mi, Thin: true}},
			thick: 172 * mi, thin: 172 * mi},
		{name: "a thin image at ratio 2 holds half its promise",
			free: 290 * mi, ratio: 2, images: []Image{{Size: 128 * mi, Allocated: 10 * mi, Thin: true}},
			thick: 236 * mi, thin: 2*300*mi - 128*mi},
		{name: "a thin image written beyond its backing at ratio 2",
			free: 200 * mi, ratio: 2, images: []Image{{Size: 128 * mi, Allocated: 100 * mi, Thin: true}},
			thick: 200 * mi, thin: 2*300*mi - 128*mi},
		{name: "thin overcommitted past the ratio (the ratio was lowered) promises nothing",
			free: 100 * mi, ratio: 1, images: []Image{{Size: 500 * mi, Allocated: 50 * mi, Thin: true}},
			thick: 0, thin: 0},
		{name: "thick owes more than is free",
			free: 10 * mi, ratio: 3, images: []Image{{Size: 100 * mi, Thin: false}},
			thick: 0, thin: 0},
		{name: "a thick image owes the blocks it shares with a snapshot, which a write copies",
			free: 172 * mi, ratio: 1, images: []Image{{Size: 128 * mi, Allocated: 128 * mi, Shared: 100 * mi}},
			thick: 72 * mi, thin: 72 * mi},
		{name: "a thin image holds nothing of what it shares, which a write copies",
			free: 290 * mi, ratio: 2, images: []Image{{Size: 128 * mi, Allocated: 10 * mi, Shared: 10 * mi, Thin: true}},
			thick: 226 * mi, thin: 2*290*mi - 128*mi},
		{name: "thin volumes restored by reflink from one snapshot are each backed for their whole size",
			free: 358 * mi, guard: 100 * mi, ratio: 1, images: []Image{
				{Size: 128 * mi, Allocated: 110 * mi, Shared: 110 * mi, Thin: true},
				{Size: 128 * mi, Allocated: 110 * mi, Shared: 110 * mi, Thin: true}},
			thick: 2 * mi, thin: 2 * mi},
		{name: "a thin image's blocks of its own count, its shared ones not",
			free: 200 * mi, ratio: 1, images: []Image{{Size: 100 * mi, Allocated: 80 * mi, Shared: 30 * mi, Thin: true}},
			thick: 150 * mi, thin: 150 * mi},
		{name: "a snapshot being taken is promised what it may copy, thick or thin",
			free: 200 * mi, ratio: 2, images: []Image{{Size: 128 * mi, Allocated: 128 * mi, Copying: 128 * mi}, {Size: 64 * mi, Allocated: 20 * mi, Thin: true, Copying: 20 * mi}},
			thick: 200*mi - 148*mi - 12*mi, thin: 2*(20*mi+200*mi-148*mi) - 64*mi},
		{name: "allocation past the size (metadata) owes nothing",
			free: 50 * mi, ratio: 1, images: []Image{{Size: 10 * mi, Allocated: 11 * mi}, {Size: 10 * mi, Allocated: 11 * mi, Thin: true}},
			thick: 50 * mi, thin: 50 * mi},
		{name: "the guard is promised to no volume",
			free: 300 * mi, guard: 80 * mi, ratio: 1, thick: 220 * mi, thin: 220 * mi},
		{name: "the guard stays free of what thick images owe",
			free: 290 * mi, guard: 80 * mi, ratio: 1, images: []Image{{Size: 128 * mi, Allocated: 10 * mi}},
			thick: 92 * mi, thin: 92 * mi},
		{name: "thin volumes at ratio 2 are backed by what the guard leaves",
			free: 290 * mi, guard: 80 * mi, ratio: 2, images: []Image{{Size: 128 * mi, Allocated: 10 * mi, Thin: true}},
			thick: 236*mi - 80*mi, thin: 2*(300*mi-80*mi) - 128*mi},
		{name: "thick volumes made before the guard took the pool past it: nothing more",
			free: 40 * mi, guard: 80 * mi, ratio: 1, images: []Image{{Size: 260 * mi, Allocated: 260 * mi}},
			thick: 0, thin: 0},
		{name: "thin volumes written past the guard: nothing more, whatever the ratio",
			free: 40 * mi, guard: 80 * mi, ratio: 4, images: []Image{{Size: 128 * mi, Allocated: 100 * mi, Thin: true}},
			thick: 0, thin: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := New(tc.free, tc.guard, tc.ratio, tc.images)
			if got := a.Available(false); got != tc.thick {
				t.Errorf("thick available %d MiB, want %d MiB", got/mi, tc.thick/mi)
			}
			if got := a.Available(true); got != tc.thin {
				t.Errorf("thin available %d MiB, want %d MiB", got/mi, tc.thin/mi)
			}
		})
	}
}

// TestRatioOneNeverOverpromises checks that at ratio 1 thick and thin answer
// alike, and that whatever is promised fits above the guard: for every mix
// of images, the promises not yet backed plus a new volume of the
// available size never take the free space below the guard.
func TestRatioOneNeverOverpromises(t *testing.T) {
	for _, guard := range []int64{0, 12 * mi} {
		for free := int64(0); free <= 64*mi; free += 8 * mi {
			for thickAlloc := int64(0); thickAlloc <= 16*mi; thickAlloc += 4 * mi {
				for thinAlloc := int64(0); thinAlloc <= 16*mi; thinAlloc += 4 * mi {
					for shared := int64(0); shared <= 16*mi; shared += 8 * mi {
						thick := Image{Size: 16 * mi, Allocated: thickAlloc, Shared: min(shared, thickAlloc)}
						thin := Image{Size: 16 * mi, Allocated: thinAlloc, Shared: min(shared, thinAlloc), Thin: true}
						a := New(free, guard, 1, []Image{thick, thin})
						if a.ThickAvailable() != a.ThinAvailable() {
							t.Fatalf("free %d, guard %d, %+v, %+v: thick %d, thin %d", free, guard, thick, thin, a.ThickAvailable(), a.ThinAvailable())
						}
						// Each image may still write anew its holes and
						// the blocks it shares (a write copies them).
						owed := (16*mi - thickAlloc + thick.Shared) + (16*mi - thinAlloc + thin.Shared)
						if avail := a.ThickAvailable(); avail > 0 && owed+avail > free-guard {
							t.Fatalf("free %d, guard %d, %+v, %+v: %d owed and %d available", free, guard, thick, thin, owed, avail)
						}
					}
				}
			}
		}
	}
}

func TestParseGuard(t *testing.T) {
	for in, want := range map[string]Guard{
		"0.5%":               {Percent: 0.5},
		"99.99%":             {Percent: 99.99},
		"0%":                 {},
		"512Mi":              {Bytes: 512 * mi},
		"2Gi":                {Bytes: 2 << 30},
		"4096":               {Bytes: 4096},
		"999999Ti":           {Bytes: 999999 << 40},
		"999999999999999999": {Bytes: 999999999999999999},
		"999999999999999Ki":  {Bytes: 999999999999999 << 10},
		KubeletGuard:         {Percent: 20},
		DefaultGuard:         {Percent: 5},
	} {
		got, err := ParseGuard(in)
		if err != nil || got != want {
			t.Errorf("ParseGuard(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "%", "-1%", "100%", "150%", "NaN%", "Inf%", "5 %x", " 5%", "5%\n", "5.%", ".5%", "1e1%", "+5%",
		"5MB", "5M", "5k", "5G", "-3", "+3", "1.5Gi", "0x10", "99999999999Ti", "1000000Ti", "00000000000000000001", "9223372036854775807"} {
		if g, err := ParseGuard(in); err == nil {
			t.Errorf("ParseGuard(%q) = %+v, want an error", in, g)
		}
	}
	if got := (Guard{Percent: 5}).Threshold(1000 * mi); got != 50*mi {
		t.Errorf("5%% of 1000 MiB = %d", got)
	}
	if got := (Guard{Bytes: 7}).Threshold(1000 * mi); got != 4096 {
		t.Errorf("7 bytes of 1000 MiB = %d, want a whole 4 KiB block", got)
	}
	if got := (Guard{Percent: 5}).Threshold(1000*mi + 4096); got != 50*mi+4096 {
		t.Errorf("5%% of 1000 MiB and 4 KiB = %d, want it rounded up to whole 4 KiB blocks", got)
	}
}

func TestCheckRatio(t *testing.T) {
	for _, r := range []float64{1, 1.5, 10} {
		if err := CheckRatio(r); err != nil {
			t.Errorf("CheckRatio(%v): %v", r, err)
		}
	}
	for _, r := range []float64{0, 0.99, -2, math.NaN(), math.Inf(1)} {
		if err := CheckRatio(r); err == nil {
			t.Errorf("CheckRatio(%v) accepted", r)
		}
	}
}

// TestKubeletGuard checks the guards a pool starts with: on the kubelet's
// filesystem one that keeps its free space above the kubelet's default hard
// eviction threshold with a margin, elsewhere the old default, which is
// below it; and which guards fall below it on a filesystem of a size.
func TestKubeletGuard(t *testing.T) {
	const gi = 1 << 30
	on, off := DefaultGuardFor(true), DefaultGuardFor(false)
	if got, want := on.Threshold(100*gi), int64(20*gi); got != want {
		t.Errorf("guard on the kubelet's filesystem of 100 GiB: got %d bytes, want %d", got, want)
	}
	if on.Threshold(100*gi) < (KubeletEvictionPercent+5)*gi {
		t.Errorf("guard on the kubelet's filesystem %v: want a margin of 5 points above the kubelet's %d%%", on, KubeletEvictionPercent)
	}
	if got, want := off.Threshold(100*gi), int64(5*gi); got != want {
		t.Errorf("guard elsewhere on 100 GiB: got %d bytes, want %d", got, want)
	}
	for _, tc := range []struct {
		name  string
		g     Guard
		total int64
		below bool
	}{
		{name: "the kubelet's default", g: on, total: 100 * gi},
		{name: "the default elsewhere", g: off, total: 100 * gi, below: true},
		{name: "at the threshold", g: Guard{Percent: KubeletEvictionPercent}, total: 100 * gi},
		{name: "none", g: Guard{}, total: 100 * gi, below: true},
		{name: "2Gi of 10Gi", g: Guard{Bytes: 2 * gi}, total: 10 * gi},
		{name: "2Gi of 100Gi", g: Guard{Bytes: 2 * gi}, total: 100 * gi, below: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.g.BelowKubeletEviction(tc.total); got != tc.below {
				t.Errorf("%v below the kubelet's eviction threshold on %d bytes: got %v, want %v", tc.g, tc.total, got, tc.below)
			}
		})
	}
}
