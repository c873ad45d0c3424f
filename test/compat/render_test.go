package compat

import (
	"fmt"

	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// peerProblems returns what keeps a peer of spec v1.11.0 from reading msg:
// a value of an enum that version does not know, or a field it does not
// know (the peer keeps it as unknown bytes and never sees it), each named
// by its path; and whether csi-lib-utils v0.20.0's protosanitizer, through
// which every sidecar logs what it receives, fails to render msg.
func peerProblems(msg proto.Message) (problems []string, renderErr error) {
	problems = walk(msg.ProtoReflect(), string(msg.ProtoReflect().Descriptor().Name()))
	func() {
		defer func() {
			if r := recover(); r != nil {
				renderErr = fmt.Errorf("protosanitizer panicked: %v", r)
			}
		}()
		_ = protosanitizer.StripSecrets(msg).String()
	}()
	return problems, renderErr
}

func walk(m protoreflect.Message, path string) []string {
	var out []string
	if u := m.GetUnknown(); len(u) > 0 {
		out = append(out, fmt.Sprintf("%s: %d bytes of fields spec v1.11.0 does not know", path, len(u)))
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				out = append(out, value(fd, l.Get(i), fmt.Sprintf("%s[%d]", p, i))...)
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				out = append(out, value(fd.MapValue(), mv, fmt.Sprintf("%s[%v]", p, k))...)
				return true
			})
		default:
			out = append(out, value(fd, v, p)...)
		}
		return true
	})
	return out
}

func value(fd protoreflect.FieldDescriptor, v protoreflect.Value, path string) []string {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return walk(v.Message(), path)
	case protoreflect.EnumKind:
		if fd.Enum().Values().ByNumber(v.Enum()) == nil {
			return []string{fmt.Sprintf("%s: value %d of %s, which spec v1.11.0 does not know", path, v.Enum(), fd.Enum().FullName())}
		}
	}
	return nil
}
