package schema

import "fmt"

// Validate checks a turn on its own (no history): ids, role, timestamps and
// every block's required fields. Checks that need the conversation, such as
// orphan_tool_result, belong to the engine.
func (t *Turn) Validate() error {
	if err := validateID(t.ID); err != nil {
		return err
	}
	if !ValidConversationID(t.ConversationID) {
		return Errorf(ReasonBadConversationID, "conversation_id %q %s", t.ConversationID, convIDRule)
	}
	if t.TS <= 0 {
		return Errorf(ReasonBadTS, "ts must be a positive Unix time in milliseconds")
	}
	switch t.Role {
	case RoleUser, RoleAssistant:
	default:
		return Errorf(ReasonBadRole, "role must be %q or %q, got %q", RoleUser, RoleAssistant, t.Role)
	}
	if err := t.Usage.validate(); err != nil {
		return err
	}
	if t.ContinuesFrom != "" {
		if !ValidConversationID(t.ContinuesFrom) {
			return Errorf(ReasonBadConversationID, "continues_from %q %s", t.ContinuesFrom, convIDRule)
		}
		if t.ContinuesFrom == t.ConversationID {
			return Errorf(ReasonBadConversationID, "continues_from names the turn's own conversation %q", t.ConversationID)
		}
	}
	for i := range t.Content.Blocks {
		if err := t.Content.Blocks[i].validate(t.Role, false); err != nil {
			return Errorf(ReasonOf(err), "content[%d]: %s", i, err.(*Error).Message)
		}
	}
	return checkInputDepth(t.Content.Blocks)
}

// checkInputDepth rejects a tool input nested deeper than MaxToolInputDepth
// in any block, however it is placed: a stray input on a block that is not a
// tool_use is stored (and read back) too.
func checkInputDepth(blocks []Block) error {
	for i := range blocks {
		b := &blocks[i]
		if len(b.Input) > 0 && jsonDepth(b.Input, MaxToolInputDepth) > MaxToolInputDepth {
			return Errorf(ReasonBadEncoding, "tool input %q nests deeper than %d levels", b.ID, MaxToolInputDepth)
		}
		if b.Content != nil {
			if err := checkInputDepth(b.Content.Blocks); err != nil {
				return err
			}
		}
	}
	return nil
}

// validate checks one block. nested is true inside a tool_result, where only
// text and image blocks may appear.
func (b *Block) validate(role Role, nested bool) error {
	switch b.Type {
	case BlockText:
		return nil
	case BlockReasoning:
		if nested {
			return Errorf(ReasonBadBlock, "a tool_result may only hold text and image blocks, got %q", b.Type)
		}
		return nil
	case BlockImage:
		if b.Source == nil {
			return Errorf(ReasonBadBlock, "image block needs a source")
		}
		switch b.Source.Type {
		case "base64":
			if b.Source.Data == "" {
				return Errorf(ReasonBadBlock, "base64 image source needs data")
			}
		case "url":
			if b.Source.URL == "" {
				return Errorf(ReasonBadBlock, "url image source needs a url")
			}
		default:
			return Errorf(ReasonBadBlock, "image source type must be base64 or url, got %q", b.Source.Type)
		}
		return nil
	}
	if nested {
		return Errorf(ReasonBadBlock, "a tool_result may only hold text and image blocks, got %q", b.Type)
	}
	switch b.Type {
	case BlockToolUse:
		if role != RoleAssistant {
			return Errorf(ReasonBadBlock, "tool_use blocks belong in assistant turns")
		}
		if b.ID == "" || b.Name == "" {
			return Errorf(ReasonBadBlock, "tool_use needs an id and a name")
		}
		return nil
	case BlockToolResult:
		if role != RoleUser {
			return Errorf(ReasonBadBlock, "tool_result blocks belong in user turns")
		}
		if b.ToolUseID == "" {
			return Errorf(ReasonBadBlock, "tool_result needs a tool_use_id")
		}
		if b.Content != nil {
			for i := range b.Content.Blocks {
				if err := b.Content.Blocks[i].validate(role, true); err != nil {
					return Errorf(ReasonOf(err), "tool_result content[%d]: %s", i, err.(*Error).Message)
				}
			}
		}
		return nil
	case "":
		return Errorf(ReasonUnknownBlockType, "block has no type")
	}
	return Errorf(ReasonUnknownBlockType, "unknown block type %q", fmt.Sprint(b.Type))
}

// validate bounds a usage: each count and their sum in [0, MaxTokenCount],
// the sum not zero. The sum becomes the conversation's context size, so an
// unbounded one would wrap into a negative size.
func (u *Usage) validate() error {
	if u == nil {
		return nil
	}
	if u.InputTokens < 0 || u.OutputTokens < 0 {
		return Errorf(ReasonBadUsage, "usage token counts must not be negative")
	}
	if u.InputTokens > MaxTokenCount || u.OutputTokens > MaxTokenCount || u.Total() > MaxTokenCount {
		return Errorf(ReasonBadUsage, "usage token counts and their sum must be at most %d", MaxTokenCount)
	}
	if u.Total() == 0 {
		// It would set the context size to zero: a provider never reports that.
		return Errorf(ReasonBadUsage, "usage reports no tokens; leave it out when it is unknown")
	}
	return nil
}
